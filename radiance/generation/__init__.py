"""Generation: sequences, the KV cache blocks, the scheduler, text in and out, the engine loop."""
