"""``SecretSource``: one of a credential or a variable, read where it says, described without its value."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.secret import SecretSource


def test_a_credential_is_read_from_the_credentials_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("s3cret-value\n")
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    assert SecretSource(credential="token").read() == "s3cret-value"
    assert SecretSource(credential="empty").read() is None
    assert SecretSource(credential="missing").read() is None
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    assert SecretSource(credential="token").read() is None


def test_a_variable_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TEST_VALUE", "s3cret-value")
    monkeypatch.setenv("SECRET_TEST_EMPTY", "")
    assert SecretSource(env="SECRET_TEST_VALUE").read() == "s3cret-value"
    assert SecretSource(env="SECRET_TEST_EMPTY").read() is None


def test_describe_names_where_and_never_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TEST_VALUE", "s3cret-value")
    assert SecretSource(env="SECRET_TEST_VALUE").describe() == "environment variable SECRET_TEST_VALUE"
    assert SecretSource(credential="token").describe() == "credential 'token'"


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({}, "exactly one"),
        ({"env": "A", "credential": "b"}, "exactly one"),
        ({"credential": "../etc/shadow"}, "file name"),
        ({"credential": ".."}, "file name"),
        ({"env": "A", "value": "x"}, "Extra inputs"),
    ],
)
def test_a_bad_source_is_refused_saying_why(raw: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        SecretSource.model_validate(raw)


def test_equal_sources_are_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {SecretSource(env="A"), SecretSource.model_validate({"env": "A"})} == {SecretSource(env="A")}
