"""Verifying a bearer credential: API keys and JWTs (RFC 6750 bearer tokens).

A credential becomes a :class:`Principal` — a name for logs, the model globs it may use,
whether it may use model control — or :class:`gateway.errors.Unauthenticated`. Keys are
compared as SHA-256 digests with ``hmac.compare_digest`` against every configured key
(no early exit, no length leak). Key files and the JWKS file are re-read when they
change (a rotated Kubernetes Secret), checked at most once a second. Neither a key nor
a token is ever logged or put in an error message.
"""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from ..config.security import ApiKey, Jwt, Rate
from ..errors import Unauthenticated
from ..fileid import FileId, file_id

__all__ = ["JwtVerifier", "KeyRing", "Principal", "bearer"]

log = logging.getLogger("oip_gateway.auth")

_RECHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class Principal:
    name: str  # "key:<name>" or "jwt:<sub>": for logs and rate buckets, never a secret
    models: re.Pattern[str] | None  # None: every model
    control: bool
    rate: Rate | None

    def may_use(self, model: str) -> bool:
        return self.models is None or self.models.fullmatch(model) is not None


def _globs(globs: Sequence[str]) -> re.Pattern[str]:
    # fnmatch.translate anchors each glob (\Z); an empty list matches nothing.
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs) or r"(?!)")


def bearer(value: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` value (RFC 6750 section 2.1; the
    scheme is case-insensitive)."""
    if value is None:
        raise Unauthenticated("credentials required: send Authorization: Bearer <key or token>")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <key or token>'")
    return token


class _Key:
    __slots__ = ("config", "digest", "principal", "seen")

    def __init__(self, config: ApiKey) -> None:
        self.config = config
        self.digest = hashlib.sha256(config.value.encode()).digest()
        self.seen = file_id(config.source[1]) if config.source[0] == "file" else None
        self.principal = Principal(f"key:{config.name}", _globs(config.models) if config.models else None,
                                   config.control, config.rate)

    def refresh(self) -> None:
        kind, path = self.config.source
        if kind != "file":
            return
        now = file_id(path)
        if now is None or now == self.seen:
            return  # a file briefly missing (a Secret's symlink swap) keeps the key it had
        try:
            with open(path, encoding="utf-8") as fh:
                value = fh.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            log.error("auth key %s: cannot re-read %s (%s); keeping the key it had", self.config.name, path, exc)
            return
        if len(value) < 16 or any(c in value for c in "\r\n\0"):
            log.error("auth key %s: %s now holds no usable key; keeping the key it had", self.config.name, path)
            return
        self.seen = now
        self.digest = hashlib.sha256(value.encode()).digest()
        log.info("auth key %s re-read from %s", self.config.name, path)


class KeyRing:
    """The configured API keys."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self._keys = [_Key(k) for k in keys]
        self._checked = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self._keys)

    def find(self, token: str) -> Principal | None:
        now = time.monotonic()
        if now - self._checked >= _RECHECK_S:
            self._checked = now
            for k in self._keys:
                k.refresh()
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for k in self._keys:  # every key is compared: the time taken says nothing about which matched
            if hmac.compare_digest(k.digest, digest):
                found = k.principal
        return found


class JwtVerifier:
    """JWTs signed by a key of the JWKS file: signature, ``exp`` (required), ``nbf``,
    issuer and audience when configured, algorithms from the configured list only."""

    def __init__(self, config: Jwt) -> None:
        self.config = config
        self._keys: dict[str | None, list[jwt.PyJWK]] = {}
        self._seen: FileId | None = None
        self._checked = 0.0
        self._load()

    def _load(self) -> None:
        path = self.config.jwks_file
        now = file_id(path)
        if now is None or now == self._seen:
            return
        try:
            with open(path, encoding="utf-8") as fh:
                keyset = jwt.PyJWKSet.from_json(fh.read())
        except (OSError, ValueError, jwt.PyJWKSetError, jwt.InvalidKeyError) as exc:
            log.error("auth.jwt: cannot read the JWKS file %s (%s); keeping the keys it had", path, exc)
            return
        keys: dict[str | None, list[jwt.PyJWK]] = {}
        for key in keyset.keys:
            keys.setdefault(key.key_id, []).append(key)
            keys.setdefault(None, []).append(key)
        self._seen = now
        self._keys = keys
        log.info("auth.jwt: %d keys from %s", len(keyset.keys), path)

    def verify(self, token: str) -> Principal:
        now = time.monotonic()
        if now - self._checked >= _RECHECK_S:
            self._checked = now
            self._load()
        cfg = self.config
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Unauthenticated("invalid credential: not a known key, not a well-formed JWT") from None
        kid = header.get("kid")
        candidates = self._keys.get(kid if isinstance(kid, str) else None, [])
        if not candidates:
            raise Unauthenticated("invalid token: signed by a key the gateway does not know (kid)")
        claims: dict[str, Any] | None = None
        reason = "signature does not verify"
        for key in candidates:
            try:
                claims = jwt.decode(token, key=key.key, algorithms=list(cfg.algorithms), audience=cfg.audience,
                                    issuer=cfg.issuer, leeway=cfg.leeway_s,
                                    options={"require": ["exp"], "verify_aud": cfg.audience is not None})
                break
            except jwt.ExpiredSignatureError:
                raise Unauthenticated("invalid token: expired") from None
            except jwt.InvalidAlgorithmError:
                raise Unauthenticated("invalid token: algorithm not allowed") from None
            except (jwt.InvalidAudienceError, jwt.InvalidIssuerError, jwt.ImmatureSignatureError,
                    jwt.MissingRequiredClaimError) as exc:
                raise Unauthenticated(f"invalid token: {exc}") from None
            except (jwt.InvalidTokenError, jwt.InvalidKeyError, ValueError, TypeError):
                continue  # another key with the same kid (or none) may verify it
        if claims is None:
            raise Unauthenticated(f"invalid token: {reason}")
        sub = claims.get("sub")
        name = f"jwt:{sub}" if isinstance(sub, str) and sub else "jwt:(no sub)"
        models: re.Pattern[str] | None = None
        if cfg.models_claim is not None:
            value = claims.get(cfg.models_claim)
            if isinstance(value, str):
                value = value.split()
            globs = [g for g in value if isinstance(g, str) and g] if isinstance(value, list) else []
            models = _globs(globs)
        control = cfg.control_claim is not None and claims.get(cfg.control_claim) is True
        return Principal(name, models, control, cfg.rate)
