"""Where a secret's value is read: a systemd credential or an environment variable of the daemon.

One model for every secret goald names (a goal's sandbox, ``[goal_sandbox.<key>]``, a notification
sink, a model provider's API key): the configuration and the protocol carry where to look, never
the value, so a value never crosses the control socket or lands in the store. :meth:`read` looks,
:meth:`describe` says where it looked without showing anything found there.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator


class SecretSource(BaseModel):
    """Where the daemon reads a secret's value: exactly one of ``credential`` or ``env``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: A file in ``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``).
    credential: str | None = None
    #: An environment variable of the daemon.
    env: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretSource:
        if (self.credential is None) == (self.env is None):
            raise ValueError("name exactly one of credential or env")
        if self.credential is not None and ("/" in self.credential or self.credential in ("", ".", "..")):
            raise ValueError("credential must be a file name in $CREDENTIALS_DIRECTORY")
        return self

    def read(self) -> str | None:
        """The value, or ``None`` when it has none here (an empty file or variable is none)."""
        if self.credential is not None:
            creds = os.environ.get("CREDENTIALS_DIRECTORY")
            path = Path(creds) / self.credential if creds else None
            if path is None or not path.is_file():
                return None
            return path.read_text().strip() or None
        assert self.env is not None
        return os.environ.get(self.env) or None

    def describe(self) -> str:
        """Where the value is looked for (never the value)."""
        return f"credential {self.credential!r}" if self.credential is not None else f"environment variable {self.env}"
