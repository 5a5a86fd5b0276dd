"""The worker's pure code: the engine interface, heartbeat content, the format choice, the breaker."""
