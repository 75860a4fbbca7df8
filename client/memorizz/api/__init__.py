"""The memorizz wire contract: framing, methods, errors (stdlib + msgspec only)."""
