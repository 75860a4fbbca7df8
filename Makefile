# Thin aliases for scripts/ (which work without make on a fresh machine).
.PHONY: run test bench schema fmt conformance install uninstall
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
# As root; packagers: make install DESTDIR=/tmp/stage PREFIX=/usr ARGS=--no-venv
install:
	DESTDIR="$(DESTDIR)" PREFIX="$(or $(PREFIX),/usr/local)" scripts/install $(ARGS)
uninstall:
	DESTDIR="$(DESTDIR)" PREFIX="$(or $(PREFIX),/usr/local)" scripts/uninstall $(ARGS)
