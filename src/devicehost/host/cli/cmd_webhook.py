"""``devicehost webhook``: check DRA claim configuration at admission; ``webhook-cert``: its certificate.

``webhook`` loads the backends the host's config allows (same file, variables and flags),
discovers them once to learn their DRA drivers and serves a validating admission webhook over
HTTPS (:mod:`devicehost.host.webhook`). ``webhook-cert`` writes a CA and a serving certificate for
the webhook's Service, for clusters without cert-manager, and prints the ``caBundle``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from devicehost.host.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandFailed,
    add_config_options,
    checked_config,
    set_handler,
)

if TYPE_CHECKING:
    from devicehost.host.cli.common import Commands
    from devicehost.host.config import HostConfig

DEFAULT_LISTEN = "0.0.0.0:8443"
DEFAULT_SERVICE = "devicehost-webhook"
DEFAULT_NAMESPACE = "kube-system"


def add_parser(commands: Commands) -> None:
    webhook = commands.add_parser(
        "webhook", help="refuse DRA claims whose configuration a backend's model refuses (admission webhook)"
    )
    add_config_options(webhook)
    add_webhook_options(webhook)
    set_handler(webhook, webhook_command, load_config=checked_config)
    cert = commands.add_parser(
        "webhook-cert",
        help="write a CA and a serving certificate for `devicehost webhook`; print the caBundle",
    )
    add_cert_options(cert)
    set_handler(cert, webhook_cert_command, load_config=_no_config)


def add_webhook_options(webhook: argparse.ArgumentParser) -> None:
    webhook.add_argument(
        "--listen-address",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve HTTPS (default {DEFAULT_LISTEN})",
    )
    webhook.add_argument("--tls-cert", type=Path, metavar="FILE", help="serving certificate (PEM); required")
    webhook.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key (PEM); required")
    webhook.add_argument(
        "--driver",
        action="append",
        default=[],
        dest="named_drivers",
        metavar="BACKEND=DRIVER",
        help="also check DRA driver DRIVER's configuration with BACKEND's model, whatever its "
        "discovery finds (for backends that discover nothing without their hardware); repeatable",
    )
    webhook.add_argument(
        "--cert-check-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often to look whether the certificate files changed (default 10; SIGHUP: at once)",
    )


def add_cert_options(cert: argparse.ArgumentParser) -> None:
    cert.add_argument(
        "--out-dir", type=Path, metavar="DIR", help="where ca.crt, tls.crt, tls.key go; required"
    )
    cert.add_argument(
        "--service", default=DEFAULT_SERVICE, help=f"the webhook's Service (default {DEFAULT_SERVICE})"
    )
    cert.add_argument(
        "--namespace",
        default=DEFAULT_NAMESPACE,
        help=f"the Service's namespace (default {DEFAULT_NAMESPACE})",
    )
    cert.add_argument(
        "--dns-name", action="append", default=[], metavar="NAME", help="another DNS name; repeatable"
    )
    cert.add_argument(
        "--ip-address",
        action="append",
        default=[],
        metavar="IP",
        help="an IP address (a webhook reached by url: https://IP:PORT/...); repeatable",
    )
    cert.add_argument(
        "--no-service-names", action="store_true", help="only the --dns-name and --ip-address names"
    )
    cert.add_argument("--days", type=int, default=365, help="days the certificates are valid (default 365)")


def _no_config(_args: argparse.Namespace) -> HostConfig:
    from devicehost.host.config import HostConfig

    return HostConfig.model_validate({})


def webhook_command(args: argparse.Namespace, config: HostConfig) -> int:
    """Load and discover the backends, then answer AdmissionReviews until SIGTERM/SIGINT."""
    import asyncio
    import ssl

    from devicehost.host.logs import configure_logging
    from devicehost.host.webhook.drivers import parse_named_drivers
    from devicehost.host.webhook.server import TlsFiles, Webhook, split_address

    try:
        split_address(args.listen_address)
        named = parse_named_drivers(args.named_drivers)
    except ValueError as exc:
        raise CommandFailed(str(exc), EXIT_USAGE) from exc
    if args.tls_cert is None or args.tls_key is None:
        raise CommandFailed(
            "--tls-cert and --tls-key are required: the API server calls webhooks over HTTPS", EXIT_USAGE
        )
    if args.cert_check_interval <= 0:
        raise CommandFailed("--cert-check-interval must be more than 0 seconds", EXIT_USAGE)
    configure_logging(config.log_level, config.log_format)
    tls = TlsFiles(args.tls_cert, args.tls_key)

    async def main() -> None:
        try:
            webhook = Webhook(config, named, tls, functools.partial(checked_config, args))
        except (OSError, ssl.SSLError) as exc:
            raise CommandFailed(f"cannot load {tls.cert} and {tls.key}: {exc}", EXIT_USAGE) from exc
        await webhook.serve(args.listen_address, args.cert_check_interval)

    try:
        asyncio.run(main())
    except OSError as exc:  # the address in use: one line, no traceback
        raise CommandFailed(f"cannot start: {exc}", EXIT_FAILED) from exc
    return EXIT_OK


def webhook_cert_command(args: argparse.Namespace, _config: HostConfig) -> int:
    """Write ca.crt, tls.crt and tls.key; the caBundle on stdout, what was written on stderr."""
    from devicehost.host.webhook.cert import CertError, service_names, write_certificates

    names = [] if args.no_service_names else service_names(args.service, args.namespace)
    names += [n for n in args.dns_name if n not in names]
    if args.out_dir is None:
        raise CommandFailed("--out-dir is required: where ca.crt, tls.crt and tls.key go", EXIT_USAGE)
    if args.days <= 0:
        raise CommandFailed("--days must be 1 or more", EXIT_USAGE)
    try:
        written = write_certificates(args.out_dir, names, args.ip_address, args.days)
    except CertError as exc:
        raise CommandFailed(str(exc), EXIT_FAILED) from exc
    print(
        f"wrote {written.ca}, {written.cert} and {written.key}, valid until "
        f"{written.not_after:%Y-%m-%d}, for {', '.join([*names, *args.ip_address])}; "
        "the caBundle follows on stdout",
        file=sys.stderr,
    )
    print(written.ca_bundle)
    return EXIT_OK
