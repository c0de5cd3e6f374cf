"""The KV cache in blocks of `block_size` slots: a sequence holds the blocks its tokens need, and
gives them back the moment it finishes or is cancelled."""

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks = list(range(num_blocks - 1, -1, -1))

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_allocate(self, sequence: Sequence, tokens: int) -> bool:
        return self.blocks_for(tokens) - len(sequence.blocks) <= len(self.free_blocks)

    def allocate(self, sequence: Sequence, tokens: int) -> None:
        """Grow the sequence's blocks to hold `tokens` positions."""
        needed = self.blocks_for(tokens) - len(sequence.blocks)
        if needed > len(self.free_blocks):
            raise MemoryError(f"sequence {sequence.id} needs {needed} more KV blocks, {len(self.free_blocks)} free")
        for _ in range(needed):
            sequence.blocks.append(self.free_blocks.pop())

    def free(self, sequence: Sequence) -> None:
        self.free_blocks.extend(reversed(sequence.blocks))
        sequence.blocks = []

    @property
    def usage(self) -> float:
        return 1 - len(self.free_blocks) / self.num_blocks
