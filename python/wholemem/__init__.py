"""wholemem: many processes sharing one row-partitioned table.

A job is a set of processes (ranks) joined by a :class:`Comm`; a
:class:`Table` is partitioned by rows among them; ``gather`` and
``scatter`` move any rows by global id into and out of numpy arrays;
:class:`Embedding` adds sparse optimizers to a table, :class:`Graph`
samples neighbours; :meth:`Table.onesided` makes a table readable by any rank alone, or by a
process outside the job (:meth:`Reader.join`). ``wholemem.pyddstore`` is a
drop-in for PyDDStore.

Every call that waits releases the GIL. Every error derives from
:class:`WholememError` and keeps the library's message; bad arguments are
also ``ValueError``, bad row ids ``IndexError``, waits past their limit
``TimeoutError``, a refused key ``PermissionError``.
"""

from ._wholemem import (
    Comm,
    Embedding,
    GoneError,
    Graph,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LocalView,
    OneSided,
    PeerLostError,
    Reader,
    RefusedError,
    Table,
    UnsupportedError,
    WaitTimeoutError,
    WholememError,
    __version__,
    probe,
    profile_record,
    profile_take,
)

__all__ = [
    "Comm",
    "Embedding",
    "GoneError",
    "Graph",
    "IndexOutOfRangeError",
    "InvalidArgumentError",
    "LocalView",
    "OneSided",
    "PeerLostError",
    "Reader",
    "RefusedError",
    "Table",
    "UnsupportedError",
    "WaitTimeoutError",
    "WholememError",
    "__version__",
    "probe",
    "profile_record",
    "profile_take",
]
