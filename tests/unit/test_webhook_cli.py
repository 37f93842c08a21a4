"""``devicehost webhook`` and ``webhook-cert``: usage errors are one line and exit status 2."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from devicehost.host.cli import main, parse
from devicehost.host.config import HostConfig


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["webhook"], "--tls-cert and --tls-key are required"),
        (["webhook", "--tls-cert", "c"], "--tls-cert and --tls-key are required"),
        (["webhook", "--tls-cert", "c", "--tls-key", "k", "--listen-address", "8443"], "HOST:PORT"),
        (["webhook", "--tls-cert", "c", "--tls-key", "k", "--driver", "nvidia"], "BACKEND=DRIVER"),
        (["webhook", "--tls-cert", "c", "--tls-key", "k", "--cert-check-interval", "0"], "more than 0"),
        (["webhook-cert"], "--out-dir is required"),
        (["webhook-cert", "--out-dir", "x", "--days", "0"], "--days"),
    ],
)
def test_usage_errors(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("devicehost: ")
    assert words in err
    assert err.count("\n") == 1


def test_missing_certificate_files_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], logging_calls: list[object]
) -> None:
    argv = ["webhook", "--tls-cert", str(tmp_path / "c"), "--tls-key", str(tmp_path / "k")]
    assert main([*argv, "--listen-address", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err.startswith(f"devicehost: cannot load {tmp_path / 'c'}")


def test_the_webhook_takes_the_hosts_config_flags_and_its_own() -> None:
    args = parse(
        ["webhook", "--backend", "dra-example", "--log-level", "debug", "--tls-cert", "c", "--tls-key", "k",
         "--driver", "a=x.io", "--driver", "b=y.io"]
    )  # fmt: skip
    config = args.load_config(args)
    assert config.enabled_backends == ("dra-example",)
    assert config.log_level == "debug"
    assert args.named_drivers == ["a=x.io", "b=y.io"]
    assert args.listen_address == "0.0.0.0:8443"


def test_webhook_cert_ignores_the_hosts_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    monkeypatch.setenv("DEVICEHOST_LOG_LEVEL", "nonsense")  # a broken host config is not its business
    assert main(["webhook-cert", "--out-dir", str(tmp_path), "--ip-address", "127.0.0.1"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def test_webhook_cert_writes_the_three_files_and_prints_the_ca_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devicehost.host.cli.cmd_webhook import webhook_cert_command

    args = parse(
        ["webhook-cert", "--out-dir", str(tmp_path / "tls"), "--no-service-names", "--dns-name", "hook"]
    )
    assert webhook_cert_command(args, HostConfig()) == 0
    out, err = capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert base64.b64decode(out.strip()) == (tmp_path / "tls" / "ca.crt").read_bytes()
    assert err.startswith(f"wrote {tmp_path / 'tls' / 'ca.crt'}, ")
    assert err.rstrip().endswith("for hook; the caBundle follows on stdout")
