"""Jobs' secrets, sealed at rest with the master key and to one node for one attempt: what
opens where, and what is refused (no servers, no addresses)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from temporalio.exceptions import ApplicationError

from oz0 import pki
from oz0.errors import WrongMasterKey
from oz0.jobs.secret_env import SecretKeeper, SecretsUnavailable
from oz0.jobs.spec import JobError, JobSpec
from oz0_common import certs, sealed_env
from oz0_node.identity import IdentityDir
from oz0_node.jobs.attempt import SECRETS_UNREADABLE, AttemptSpec, node_secrets

SECRET = "hunter2-\u00e9-$(rm -rf /)"
JOB, OTHER_JOB = "job-0123456789ab", "job-ba9876543210"
NODE, OTHER_NODE = "node-aaaaaaaaaaaa", "node-bbbbbbbbbbbb"


def sealed_for(key: ec.EllipticCurvePrivateKey, **bound: object) -> str:
    where: dict[str, object] = {"job_id": JOB, "attempt": 1, "node_id": NODE, **bound}
    return sealed_env.seal(
        key.public_key(),
        {"DB_PASSWORD": SECRET},
        job_id=str(where["job_id"]),
        attempt=int(str(where["attempt"])),
        node_id=str(where["node_id"]),
    )


def test_an_envelope_opens_with_the_node_key_for_its_job_attempt_and_node_only() -> None:
    key = certs.new_private_key()
    text = sealed_for(key)
    assert SECRET.encode() not in base64.b64decode(text)
    opened = sealed_env.open_sealed(key, text, job_id=JOB, attempt=1, node_id=NODE)
    assert opened == {"DB_PASSWORD": SECRET}
    for elsewhere in ({"job_id": OTHER_JOB}, {"attempt": 2}, {"node_id": OTHER_NODE}):
        where: dict[str, object] = {"job_id": JOB, "attempt": 1, "node_id": NODE, **elsewhere}
        with pytest.raises(sealed_env.SealedEnvError, match="does not open") as refused:
            sealed_env.open_sealed(key, text, **where)  # type: ignore[arg-type]
        assert SECRET not in str(refused.value)


def test_an_envelope_sealed_to_another_key_is_refused_as_not_for_this_key() -> None:
    text = sealed_for(certs.new_private_key())
    with pytest.raises(sealed_env.NotForThisKey, match="another key"):
        sealed_env.open_sealed(certs.new_private_key(), text, job_id=JOB, attempt=1, node_id=NODE)


@pytest.mark.parametrize("where", [0, 1, 40, 100, 120, -1])
def test_a_tampered_envelope_is_refused(where: int) -> None:
    key = certs.new_private_key()
    raw = bytearray(base64.b64decode(sealed_for(key)))
    raw[where] ^= 0x01
    with pytest.raises(sealed_env.SealedEnvError):
        sealed_env.open_sealed(
            key, base64.b64encode(bytes(raw)).decode(), job_id=JOB, attempt=1, node_id=NODE
        )


def test_envelopes_that_are_not_envelopes_are_refused_without_echoing_them() -> None:
    key = certs.new_private_key()
    for text in ("not base64!", base64.b64encode(b"\x01short").decode(), "", SECRET):
        with pytest.raises(sealed_env.SealedEnvError) as refused:
            sealed_env.open_sealed(key, text, job_id=JOB, attempt=1, node_id=NODE)
        assert SECRET not in str(refused.value)


def test_a_sealed_job_secret_unseals_only_for_its_cluster_job_and_name() -> None:
    keeper = SecretKeeper("prod", b"k" * 32)
    sealed = keeper.seal(JOB, "DB_PASSWORD", SECRET)
    assert SECRET.encode() not in sealed
    assert keeper.unseal(JOB, "DB_PASSWORD", sealed) == SECRET
    for job, name in ((OTHER_JOB, "DB_PASSWORD"), (JOB, "API_KEY")):
        with pytest.raises(SecretsUnavailable) as refused:
            keeper.unseal(job, name, sealed)
        assert SECRET not in str(refused.value)
    with pytest.raises(SecretsUnavailable):
        SecretKeeper("staging", b"k" * 32).unseal(JOB, "DB_PASSWORD", sealed)
    # Not a CA key either: the kind is bound as well as the names.
    with pytest.raises(WrongMasterKey):
        pki.unseal(b"k" * 32, sealed, "prod", pki.Sealed.CLUSTER_CA_KEY)


def test_a_server_without_the_master_key_refuses_to_keep_secrets() -> None:
    keeper = SecretKeeper("prod", None)
    with pytest.raises(SecretsUnavailable, match="does not hold the cluster's master key"):
        keeper.seal(JOB, "DB_PASSWORD", SECRET)
    assert "k" * 8 not in repr(SecretKeeper("prod", b"k" * 32))


def test_secret_env_is_checked_like_env_and_never_shown_in_the_spec() -> None:
    body = {"command": ["true"], "env": {"LANG": "C"}, "secret_env": {"DB_PASSWORD": SECRET}}
    spec = JobSpec.from_json(body)
    assert spec.secret_env == {"DB_PASSWORD": SECRET} and SECRET not in repr(spec)
    refused = {
        "given both in env and in secret_env": {"LANG": SECRET},
        "are the agent's": {"OZ0_TOKEN": SECRET},
        "invalid environment variable name": {"1BAD": SECRET},
        "invalid value for environment variable DB": {"DB": SECRET + "\0"},
    }
    for message, secret_env in refused.items():
        with pytest.raises(JobError, match=message) as e:
            JobSpec.from_json({**body, "secret_env": secret_env})
        assert SECRET not in str(e.value)


def node_dir(tmp_path: Path) -> tuple[IdentityDir, ec.EllipticCurvePrivateKey]:
    identity = IdentityDir(tmp_path)
    identity.create()
    return identity, identity.load_or_create_key()


def test_the_node_opens_its_secrets_with_its_key_and_never_shows_them(tmp_path: Path) -> None:
    identity, key = node_dir(tmp_path)
    raw = {"job_id": JOB, "attempt": 1, "command": ["env"], "secrets": sealed_for(key)}
    spec = AttemptSpec.parse(raw, node_secrets(identity, NODE))
    assert spec.secret_env == {"DB_PASSWORD": SECRET} and spec.env == {}
    assert SECRET not in repr(spec)


@pytest.mark.parametrize("wrong", ["another node's key", "another attempt", "tampered"])
def test_secrets_the_node_cannot_open_fail_the_attempt_without_retry_or_value(
    tmp_path: Path, wrong: str
) -> None:
    identity, key = node_dir(tmp_path)
    text = {
        "another node's key": sealed_for(certs.new_private_key()),
        "another attempt": sealed_for(key, attempt=2),
        "tampered": sealed_for(key)[:-6] + "AAAA==",
    }[wrong]
    raw = {"job_id": JOB, "attempt": 1, "command": ["env"], "secrets": text}
    with pytest.raises(ApplicationError) as refused:
        AttemptSpec.parse(raw, node_secrets(identity, NODE))
    assert refused.value.type == SECRETS_UNREADABLE and refused.value.non_retryable
    assert "cannot be read on this node" in str(refused.value)
    assert SECRET not in str(refused.value) and text not in str(refused.value)
