"""The settings that bound the daemon's own reads of a work directory (issue 24): their defaults,
and their validation (a bad value names the key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.settings import ConfigError, load_settings
from goals.fingerprint_limits import MAX_FINGERPRINT_BYTES, MAX_FINGERPRINT_SECONDS


def test_the_fingerprint_bounds_default_to_256_mib_and_2_s(tmp_path: Path) -> None:
    s = load_settings(state_dir=str(tmp_path))
    assert (s.fingerprint_max_bytes, s.fingerprint_max_seconds) == (256 * 1024 * 1024, 2.0)
    assert (s.fingerprint_max_bytes, s.fingerprint_max_seconds) == (MAX_FINGERPRINT_BYTES, MAX_FINGERPRINT_SECONDS)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("fingerprint_max_bytes", -1),
        ("fingerprint_max_bytes", "lots"),
        ("fingerprint_max_seconds", 0),
        ("fingerprint_max_seconds", 3600),
    ],
)
def test_a_bad_fingerprint_bound_is_refused_naming_its_key(tmp_path: Path, key: str, value: object) -> None:
    config = tmp_path / "goald.toml"
    config.write_text(f'state_dir = "{tmp_path}"\n{key} = {value!r}\n'.replace("'", '"'))
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        load_settings(config)
