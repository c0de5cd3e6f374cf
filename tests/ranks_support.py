"""What the multi-process device tests share: why two cards are not there to test on, and running
one spawned process per rank until each reports."""


def cards_reason(needed: int, what: str) -> str | None:
    """None when `needed` NVIDIA cards can be used; else the skip reason, naming `what` needs them."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return "cuda-bindings is not installed (pip install 'radiance[cuda]')"
    try:
        if int(driver.cuInit(0)[0]) != 0:
            return "no usable NVIDIA driver"
        count = driver.cuDeviceGetCount()[1]
    except Exception as error:
        return f"no NVIDIA driver: {type(error).__name__}: {error}"
    return None if count >= needed else f"{what} need {needed} NVIDIA cards, {count} visible"


def run_ranks(processes, queue, timeout: float = 120.0) -> list[dict]:
    """Start the rank processes, take one report dict from each (by rank), join them, and fail on
    any rank's reported error."""
    for process in processes:
        process.start()
    try:
        reports = sorted((queue.get(timeout=timeout) for _ in processes), key=lambda r: r["rank"])
    finally:
        for process in processes:
            process.join(timeout=30)
    for report in reports:
        assert "error" not in report, f"rank {report['rank']}: {report['error']}"
    return reports
