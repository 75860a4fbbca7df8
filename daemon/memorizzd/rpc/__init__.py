"""The socket API: listeners, framing, peer credentials and the dispatch boundary."""
