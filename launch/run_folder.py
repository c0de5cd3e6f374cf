"""A launch's private folder: 0700, holding the ipc:// endpoints and the secret every message is
signed with. Removed at the end of the launch, whatever the end was."""

import os
import secrets
import shutil
import tempfile
from pathlib import Path


class RunFolder:
    def __init__(self, secret: bytes | None = None):
        """`secret`: the launch's signing secret where nodes share it (their key file), else a new one."""
        base = os.environ.get("XDG_RUNTIME_DIR") if os.access(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), os.W_OK) else None
        self.path = Path(tempfile.mkdtemp(prefix="radiance-", dir=base))
        os.chmod(self.path, 0o700)
        self.run_id = self.path.name
        self.secret = secret or secrets.token_bytes(32)
        secret_file = self.path / "secret"
        descriptor = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(self.secret)
        self.secret_file = secret_file

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
