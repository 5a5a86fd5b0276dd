"""The gateway's I/O: the bus relay, the model catalog's follower, HTTP server config, metrics."""
