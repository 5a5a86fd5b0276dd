"""Redis-held state: the client, dedupe markers, the attempt fence and batched commands."""
