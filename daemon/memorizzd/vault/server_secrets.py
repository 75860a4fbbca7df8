"""A server's secrets: the refs they live under, out of a spec and back at connect.

``servers/add`` moves the bearer token, the custom header values and the
secret env values into the vault (``extract_secrets``) and stores the spec
``stripped`` of them: names stay, values become empty. Config-file servers keep
their inline values in memory only. At connect ``resolve_secrets`` takes an
inline value when there is one, else asks the vault.
"""

from __future__ import annotations

import contextlib
from urllib.parse import quote, urlsplit

import msgspec

from memorizz.api.methods import ServerSpec
from memorizzd.redact import ordered
from memorizzd.vault.protocol import CredentialStore
from memorizzd.vault.stores import resolve_value


def token_ref(server: str) -> str:
    return f"server/{server}/token"


def header_ref(server: str, header: str) -> str:
    return f"server/{server}/header/{header}"


def env_ref(server: str, key: str) -> str:
    return f"server/{server}/env/{key}"


def oauth_client_secret_ref(server: str) -> str:
    """The operator's pre-registered OAuth client secret."""
    return f"server/{server}/oauth/client_secret"


def oauth_private_key_ref(server: str) -> str:
    """The operator's pre-registered OAuth client's private key (private_key_jwt)."""
    return f"server/{server}/oauth/private_key"


def oauth_assertion_ref(server: str) -> str:
    """The JWT bearer grant's assertion (``oauth_grant = "jwt_bearer"``)."""
    return f"server/{server}/oauth/assertion"


def oauth_subject_token_ref(server: str) -> str:
    """The token exchange's subject token, an ID token (``token_exchange``)."""
    return f"server/{server}/oauth/subject_token"


def oauth_idp_client_secret_ref(server: str) -> str:
    """The client's secret at the enterprise identity provider (``token_exchange``)."""
    return f"server/{server}/oauth/idp_client_secret"


def url_ref(server: str) -> str:
    """A built-in bridge's base URL (the Cognee tenant's)."""
    return f"server/{server}/url"


def server_prefix(server: str) -> str:
    return f"server/{server}/"


class ServerSecrets(msgspec.Struct, frozen=True):
    """What a connection needs: HTTP headers (with ``Authorization``) or child env."""

    headers: dict[str, str] = {}
    env: dict[str, str] = {}
    url: str | None = None
    """A built-in bridge's base URL (from the vault)."""

    def __repr__(self) -> str:
        return f"ServerSecrets(headers={sorted(self.headers)}, env={sorted(self.env)})"

    def hidden(self) -> tuple[str, ...]:
        """The values a server may quote back that must never be shown (in an
        error, ``last_error`` or a log line): each header value (the bearer
        token alone too), secret env value and a built-in bridge's tenant URL
        (and host), as sent and %-encoded (``redact.ordered``)."""
        found: set[str] = set()
        for name, value in self.headers.items():
            found.add(value)
            if name.lower() == "authorization":
                found.add(value.partition(" ")[2].strip())
        found.update(self.env.values())
        if self.url:  # a built-in bridge's tenant URL, and its host name
            found.add(self.url)
            with contextlib.suppress(ValueError):
                found.add(urlsplit(self.url).hostname or "")
        found |= {quote(value, safe="") for value in found}
        return ordered(found)


def extract_secrets(spec: ServerSpec) -> dict[str, str]:
    """ref -> value for every secret given inline in ``spec``."""
    secrets: dict[str, str] = {}
    if spec.token:
        secrets[token_ref(spec.name)] = spec.token
    for header, value in spec.headers.items():
        secrets[header_ref(spec.name, header)] = value
    for key, value in spec.secret_env.items():
        secrets[env_ref(spec.name, key)] = value
    if spec.oauth_client_secret:
        secrets[oauth_client_secret_ref(spec.name)] = spec.oauth_client_secret
    if spec.transport == "builtin" and spec.url:
        secrets[url_ref(spec.name)] = spec.url
    if spec.oauth_private_key:
        secrets[oauth_private_key_ref(spec.name)] = spec.oauth_private_key
    if spec.oauth_assertion:
        secrets[oauth_assertion_ref(spec.name)] = spec.oauth_assertion
    if spec.oauth_subject_token:
        secrets[oauth_subject_token_ref(spec.name)] = spec.oauth_subject_token
    if spec.oauth_idp_client_secret:
        secrets[oauth_idp_client_secret_ref(spec.name)] = spec.oauth_idp_client_secret
    return secrets


def stripped(spec: ServerSpec) -> ServerSpec:
    """The spec without secret values: what the state database may hold."""
    return msgspec.structs.replace(
        spec,
        token=None,
        url=None if spec.transport == "builtin" else spec.url,
        headers=dict.fromkeys(spec.headers, ""),
        secret_env=dict.fromkeys(spec.secret_env, ""),
        oauth_client_secret="" if spec.oauth_client_secret else None,
        oauth_private_key="" if spec.oauth_private_key else None,
        oauth_assertion="" if spec.oauth_assertion else None,
        oauth_subject_token="" if spec.oauth_subject_token else None,
        oauth_idp_client_secret="" if spec.oauth_idp_client_secret else None,
    )


def server_refs(vault: CredentialStore, server: str) -> list[str]:
    prefix = server_prefix(server)
    return [ref for ref in vault.refs() if ref.startswith(prefix)]


def forget_servers_gone(vault: CredentialStore, present: set[str]) -> list[str]:
    """Delete the secrets of every server not in ``present`` (the servers
    the daemon starts with); the refs deleted. ``servers/remove`` deletes a
    server's row, then its secrets: a daemon killed between the two left
    them for ever, as it did a grant a config server had when the file gave
    it up."""
    gone: list[str] = []
    for ref in vault.refs():
        if not ref.startswith("server/"):
            continue
        name = ref[len("server/") :].split("/", 1)[0]
        if name not in present:
            vault.delete(ref)
            gone.append(ref)
    return gone


def resolve_secrets(spec: ServerSpec, vault: CredentialStore) -> ServerSecrets:
    """Inline values where present (config file), else from the vault.

    A value that is a reference (``credential:NAME``, a plugin store's
    ``PREFIX:NAME``) is resolved here, at connect (``stores.py``).
    Raises ``VaultError`` (naming the ref) when one is missing or unreadable.
    """
    headers: dict[str, str] = {}
    if spec.transport == "builtin":  # an API key (as the bridge sends it) and the URL
        key = spec.token or vault.get(token_ref(spec.name))
        url = spec.url or vault.get(url_ref(spec.name))
        headers = {"X-Api-Key": resolve_value(vault, key)}
        return ServerSecrets(headers=headers, url=url)
    if spec.auth == "bearer":
        token = spec.token or vault.get(token_ref(spec.name))
        headers["Authorization"] = f"Bearer {resolve_value(vault, token)}"
    for header, value in spec.headers.items():
        found = value or vault.get(header_ref(spec.name, header))
        headers[header] = resolve_value(vault, found)
    env = {
        key: resolve_value(vault, value or vault.get(env_ref(spec.name, key)))
        for key, value in spec.secret_env.items()
    }
    return ServerSecrets(headers=headers, env=env)
