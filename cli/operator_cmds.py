"""`orchestrator-zero operator ...`: the operator's own credentials."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cyclopts import App

from cli.client import ApiClient
from cli.output import print_json
from cli.params import ContextPath, JsonFlag
from oz0.context import select
from oz0_common import certs
from oz0_common.files import write_private

app = App(name="operator", help_format="markdown")  # help: cli/main.py


@app.command
def renew(*, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Make a new key, have the cluster sign a 90-day certificate, replace both."""
    ctx = select(context)
    # The renewal voids the certificate this client holds: no second request with it.
    client = ApiClient(ctx, learn_servers=False)
    key = certs.new_private_key()
    csr = certs.make_csr(key, ctx.operator)
    answer = client.post(
        "/api/v1/operator/renew",
        {"csr": csr.public_bytes(serialization.Encoding.PEM).decode()},
    )
    cert_pem = str(answer["certificate"]).encode()
    cert = certs.cert_from_pem(cert_pem)
    if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
        raise RuntimeError("the cluster signed a certificate for another key")
    # The old certificate is void from now on: write the key first, then the certificate.
    write_private(ctx.key_path, certs.key_to_pem(key))
    write_private(ctx.cert_path, cert_pem)
    if json:
        print_json({"operator": ctx.operator, "not_after": answer["not_after"]})
    else:
        print(f"operator {ctx.operator}: new certificate valid until {answer['not_after']}")
    return 0
