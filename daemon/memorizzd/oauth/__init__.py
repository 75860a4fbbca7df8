"""The OAuth 2.1 client: what lets the daemon hold a grant for the whole host.

The MCP SDK's ``OAuthClientProvider`` runs its flow lazily inside a request
and waits on a browser; a daemon needs the authorization URL on demand, a
login that outlives no request, tokens refreshed before they expire and
expiries that survive a restart. So the flow is ours, built on the SDK's
metadata models and discovery helpers (``mcp.shared.auth``,
``mcp.client.auth.utils``):

* ``discovery``: RFC 9728 protected resource metadata, RFC 8414 / OIDC
  authorization server metadata, exact issuer match, PKCE S256 required.
* ``endpoints``: the token, registration and revocation requests, with the
  client authentication methods none / basic / post.
* ``login``: ``auth/login`` and ``auth/complete``: client identity
  (pre-registered, client ID metadata document, RFC 7591 registration), PKCE,
  ``state``, ``iss``, RFC 8707 ``resource``, scope selection.
* ``grant``: what a login leaves in the vault.
* ``keeper``: one per server: the current access token, single-flight
  refresh ahead of expiry, rotation written durably before use.

Every request goes through the hardened egress client.
"""
