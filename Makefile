# Thin aliases for scripts/ (which work without make on a fresh machine).
.PHONY: run test bench schema fmt conformance
run:
	scripts/run $(ARGS)
test:
	scripts/test $(ARGS)
bench:
	scripts/bench $(ARGS)
schema:
	scripts/bootstrap && .venv/bin/python -m memorizz.api.schema
fmt:
	scripts/bootstrap && .venv/bin/ruff format client daemon tests bench && .venv/bin/ruff check --fix client daemon tests bench
conformance:
	scripts/conformance $(ARGS)
