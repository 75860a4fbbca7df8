"""What an operator watches: metrics (``metrics.py``, served by ``http.py``),
traces (``tracing.py``, optional) and structured logs (``logs.py``).

At the bottom of the daemon's layers: every room may count what it does here
(a refusal in ``egress``, a refresh in ``oauth``) without importing the rooms
that serve or read the counts.
"""
