"""The listeners' certificate files, taken up again when they change (Kubernetes rotates a
mounted TLS Secret by swapping the ``..data`` symlink: cert and key change together).

A change is seen through ``os.stat`` of the cert, key and client CA files (following
symlinks). New files are checked first by loading them into a scratch SSLContext: a
certificate that does not match its key (a half-written rotation) is not taken — the
listeners keep the certificate they have, and the next change is tried again. Open
connections keep the certificate they were made with; only new handshakes see the new
one, so nothing is dropped.

- HTTP (uvicorn): the new files go into a fresh ``ssl.SSLContext`` (made as uvicorn makes
  its own), and every new handshake is moved onto it from the listener's context in the
  ClientHello callback (``sni_callback``, which OpenSSL calls with or without SNI; setting
  ``SSLObject.context`` there is ``SSL_set_SSL_CTX``): the new chain and the new trust
  store. Loading into the live context instead could only *add* client CAs
  (``load_verify_locations``): a replaced CA — one revoked after a compromise — stayed
  trusted until a restart. Connections already open keep the context they were made with.
- gRPC on the gateway's own HTTP/2 listener (frontend/h2listen.py): the same, with its own
  context (ALPN ``h2``).
- gRPC on grpc.aio (the fallback): ``grpc.dynamic_ssl_server_credentials`` asks
  :meth:`CertFiles.grpc_fetch` at each new handshake; it answers the new configuration once,
  after a change.
"""
from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable

import grpc

from .config.schema import Tls
from .fileid import FileId, file_id

__all__ = ["CertFiles"]

log = logging.getLogger("oip_gateway.tls")

Signature = tuple[FileId | None, ...]


class CertFiles:
    def __init__(self, tls: Tls) -> None:
        self.tls = tls
        self._lock = threading.Lock()  # grpc_fetch runs on gRPC's threads
        self._loaded = self._signature()
        self._grpc_seen = self._loaded
        self._refused: Signature | None = None
        # New handshakes on a listener whose context is the key move onto the value.
        self._current: dict[int, ssl.SSLContext] = {}
        self.reloads = 0

    def _signature(self) -> Signature:
        return (file_id(self.tls.cert), file_id(self.tls.key), file_id(self.tls.client_ca))

    def _read(self) -> tuple[bytes, bytes, bytes | None] | None:
        """The files' bytes, when they form a usable certificate chain + key (and CA)."""
        t = self.tls
        try:
            scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            scratch.load_cert_chain(t.cert, t.key)
            if t.client_ca is not None:
                scratch.load_verify_locations(t.client_ca)
            with open(t.cert, "rb") as c, open(t.key, "rb") as k:
                cert, key = c.read(), k.read()
            ca = None
            if t.client_ca is not None:
                with open(t.client_ca, "rb") as fh:
                    ca = fh.read()
        except (OSError, ssl.SSLError, ValueError) as exc:
            sig = self._signature()
            if sig != self._refused:  # once per version of the files, not once a second
                self._refused = sig
                log.error("TLS files changed but cannot be used (%s); keeping the current certificate", exc)
            return None
        return cert, key, ca

    def changed(self) -> bool:
        sig = self._signature()
        return sig != self._loaded and None not in sig[:2]

    def reload_http(self, context: ssl.SSLContext, fresh: Callable[[], ssl.SSLContext]) -> bool:
        """Take changed files for the listener whose live context is ``context``: ``fresh()``
        makes a context from the files as they are now, and new handshakes move onto it. True
        when it did."""
        return self.reload([(context, fresh)])

    def reload(self, listeners: list[tuple[ssl.SSLContext, Callable[[], ssl.SSLContext]]]) -> bool:
        """:meth:`reload_http` for several listeners at once (HTTP and gRPC read one set of files)."""
        with self._lock:
            if not self.changed():
                return False
            sig = self._signature()
            if self._read() is None:
                return False
            try:
                made = [(context, fresh()) for context, fresh in listeners]
            except (OSError, ssl.SSLError, ValueError) as exc:  # (changed again since _read)
                log.error("TLS files changed but cannot be used (%s); keeping the current certificate", exc)
                return False
            for context, current in made:
                self._current[id(context)] = current
                context.sni_callback = self._to_current
            self._loaded = sig
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.tls.cert)
            return True

    def _to_current(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                    context: ssl.SSLContext) -> None:
        """The listener context's ClientHello callback: the handshake goes on with the newest
        files' context (its certificate, its client CAs)."""
        current = self._current.get(id(context))
        if current is not None and current is not context:
            conn.context = current

    def grpc_credentials(self) -> grpc.ServerCredentials:
        files = self._read()
        if files is None:
            raise ValueError(f"cannot use the TLS files {self.tls.cert}, {self.tls.key}")
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(files), self.grpc_fetch,
            require_client_authentication=self.tls.client_ca is not None)

    @staticmethod
    def _grpc_config(files: tuple[bytes, bytes, bytes | None]) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = files
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def grpc_fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC before each new handshake: a new configuration after a change, else None."""
        try:
            with self._lock:
                sig = self._signature()
                if sig == self._grpc_seen or None in sig[:2]:
                    return None
                files = self._read()
                if files is None:
                    return None
                self._grpc_seen = sig
                log.info("TLS certificate for gRPC reloaded from %s", self.tls.cert)
                return self._grpc_config(files)
        except Exception:  # never let an exception cross into gRPC's handshake
            log.exception("checking the TLS files for gRPC failed")
            return None
