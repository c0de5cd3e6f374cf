"""The OpenAI-compatible server: `radiance --serve` (one rank) and `radiance-launch --serve` (TP
ranks). FastAPI on uvicorn for HTTP; one engine thread owns the Engine and steps it; requests reach
it through thread-safe queues and their tokens come back to each request's asyncio queue.

Nothing here is imported unless a server is asked for: `options` alone is light (click)."""
