"""An in-memory keyring, for the demo and tests only, that keyring never picks by itself.

keyring registers every :class:`~keyring.backend.KeyringBackend` subclass that is defined and,
unless one is configured, uses the viable one with the highest priority. A backend that forgets
its secrets when the process ends must never be that choice: ``prefect-ito login`` would then
report success and lose the token. So :attr:`MemoryKeyring.priority` raises, which makes the class
not viable (keyring neither chooses nor chains it, and refuses it by name in
``PYTHON_KEYRING_BACKEND``), and nothing the package imports by default imports this module. Use
it only explicitly::

    keyring.set_keyring(MemoryKeyring())
"""

from __future__ import annotations

import keyring.errors
from keyring.backend import KeyringBackend
from keyring.compat import properties

__all__ = ["MemoryKeyring"]


class MemoryKeyring(KeyringBackend):
    """A keyring that lives only in this process's memory; set it explicitly or not at all.

    ``prefect-ito demo`` keeps its throwaway token here, so the token never reaches a file or the
    environment a child process inherits; tests use it in place of a secure OS keyring.

    Attributes:
        secrets: The stored passwords, keyed by ``(service, username)``.
    """

    @properties.classproperty
    def priority(cls) -> float:
        # keyring's `viable` is "reading the priority does not raise"; not viable means keyring
        # never chooses this backend nor chains it.
        raise RuntimeError(
            "MemoryKeyring forgets secrets when the process ends; "
            "it is used only through keyring.set_keyring()"
        )

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.secrets: dict[tuple[str, str], str] = {}

    def __str__(self) -> str:
        # KeyringBackend.__str__ shows the priority, which raises here.
        return f"{type(self).__module__}.{type(self).__qualname__} (in memory, set explicitly)"

    def get_password(self, service: str, username: str) -> str | None:
        return self.secrets.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.secrets[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.secrets.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError(username)
