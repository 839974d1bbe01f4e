"""TLS material (``cryptography``'s x509): a demo CA and the SuperLink's certificate for
loopback (:func:`make_tls`), a deployment's own CA and certificate checked and taken in
(:func:`use_own_tls`), and SuperNode authentication keys.

The demo CA is for one machine: a real deployment brings its own CA's certificates, and
each SuperNode makes its authentication key on its own machine (``secagg flower init``).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from secagg.errors import ConfigError
from secagg.flower.keystore import write_private_bytes


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_tls(
    folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
) -> dict[str, Path]:
    """``ca.crt`` (every SuperNode and the CLI trust it), ``server.pem`` and ``server.key``
    (the SuperLink's, valid for ``hosts``), all in ``folder``; the keys mode 0600. The CA's
    key is not kept: nothing else will be signed with it."""
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=30))
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("secagg demo CA"))
        .issuer_name(_name("secagg demo CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    write_private_bytes(paths["key"], _pem_key(server_key))
    return paths


def use_own_tls(
    folder: Path, *, ca: Path, cert: Path, key: Path, hosts: tuple[str, ...] = ()
) -> dict[str, Path]:
    """Take a deployment's own CA certificate and the SuperLink's certificate and key into
    ``folder`` (as :func:`make_tls` names them), after checking what would otherwise fail
    only when the first SuperNode connects: each file parses, the certificate was issued
    by that CA (its signature verifies), the key is the certificate's, the certificate is
    valid now, and it names every one of ``hosts``. ConfigError says which check failed."""
    loaded = {}
    for what, path in (("CA certificate", ca), ("certificate", cert)):
        try:
            loaded[what] = x509.load_pem_x509_certificate(Path(path).read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is not a PEM {what}: {exc}") from None
    authority, server = loaded["CA certificate"], loaded["certificate"]
    try:
        private = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{key} is not an unencrypted PEM private key: {exc}") from None
    try:
        server.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        raise ConfigError(f"{cert} was not issued by the CA of {ca}") from None
    if private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != server.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise ConfigError(f"{key} is not the private key of {cert}")
    for what, made in (("CA certificate", authority), ("certificate", server)):
        _check_valid_now(what, made)
    _check_names(cert, server, hosts)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(authority.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    write_private_bytes(paths["key"], Path(key).read_bytes())
    return paths


def _check_valid_now(what: str, made: x509.Certificate) -> None:
    now = datetime.datetime.now(datetime.UTC)
    if not made.not_valid_before_utc <= now <= made.not_valid_after_utc:
        raise ConfigError(
            f"the {what} is valid from {made.not_valid_before_utc:%Y-%m-%d} to "
            f"{made.not_valid_after_utc:%Y-%m-%d}, not now"
        )


def _names_in(server: x509.Certificate) -> set[str]:
    """The host names and addresses a server certificate is valid for."""
    try:
        named = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    names = {str(n) for n in named.get_values_for_type(x509.DNSName)}
    return names | {str(n) for n in named.get_values_for_type(x509.IPAddress)}


def _check_names(cert: Path, server: x509.Certificate, hosts: tuple[str, ...]) -> None:
    names = _names_in(server)
    missing = [h for h in hosts if h not in names]
    if missing:
        raise ConfigError(
            f"{cert} does not name {', '.join(missing)} (it names "
            f"{', '.join(sorted(names)) or 'no host'}): SuperNodes that connect by that "
            "name would refuse it"
        )


def check_kept_tls(folder: Path, hosts: tuple[str, ...] = ()) -> None:
    """A deployment's ``tls/`` can serve another run as it is: its CA certificate and the
    SuperLink's certificate are valid now and the certificate names every one of
    ``hosts``. ConfigError says which check failed (re-preparing keeps ``tls/``, so what
    fails here fails at the SuperNodes' first connection)."""
    loaded = {}
    for what, name in (("CA certificate", "ca.crt"), ("certificate", "server.pem")):
        path = Path(folder) / name
        try:
            loaded[what] = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is not a PEM {what}: {exc}") from None
        _check_valid_now(what, loaded[what])
    _check_names(Path(folder) / "server.pem", loaded["certificate"], hosts)


def make_node_key(private: Path) -> Path:
    """A SuperNode's authentication key: EC P-384 in OpenSSH encoding (what Flower 1.30
    to 1.42 read), the private key at ``private`` (mode 0600), the public one beside it as
    ``.pub`` (what ``flwr supernode register`` takes). As ``ssh-keygen -t ecdsa -b 384``."""
    key = ec.generate_private_key(ec.SECP384R1())
    write_private_bytes(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    public = private.with_name(private.name + ".pub")
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return public
