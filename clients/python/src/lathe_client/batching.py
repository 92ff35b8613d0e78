"""Batches sized to finish well within a call's deadline, and the progress of an upload.

`Lathe.upload_documents` sends one `wait` upsert per batch: each is applied whole or not at all,
and a batch that runs past its deadline can be sent again (an upsert is idempotent, and the server
reuses the stored vectors of unchanged sections, so what was already stored costs no inference).
Batches are cut by bytes of document text, sized from the throughput measured so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# Smallest batch asked for, in bytes (a single larger document is still sent alone).
MIN_BATCH_BYTES = 4 * 1024
# Largest batch, in bytes: well under the server's default 64 MiB message limit.
MAX_BATCH_BYTES = 16 << 20


def batch_end(sizes: Sequence[int], start: int, max_bytes: int, max_documents: int) -> int:
    """The end of the batch starting at document `start`: documents while their text adds up to
    at most `max_bytes` (always at least one, however large), and at most `max_documents`."""
    end, taken = start, 0
    while end < len(sizes) and end - start < max_documents:
        if end > start and taken + sizes[end] > max_bytes:
            break
        taken += sizes[end]
        end += 1
    return end


class BatchSizer:
    """Sizes batches in bytes so that one takes about `target_seconds` at the throughput
    measured so far (smoothed, the latest batch weighing half)."""

    def __init__(self, first_batch_bytes: int, target_seconds: float) -> None:
        if target_seconds <= 0:
            raise ValueError("target_seconds must be above 0")
        self.batch_bytes = _clamp(first_batch_bytes)
        self.target_seconds = target_seconds
        self.throughput: float | None = None

    def observe(self, sent_bytes: int, seconds: float) -> None:
        """A batch of `sent_bytes` took `seconds`: size the next to take the target time,
        growing at most 4-fold at a time."""
        measured = sent_bytes / max(seconds, 1e-3)
        self.throughput = measured if self.throughput is None else 0.5 * self.throughput + 0.5 * measured
        wanted = int(self.throughput * self.target_seconds)
        self.batch_bytes = _clamp(min(wanted, self.batch_bytes * 4))

    def timed_out(self, sent_bytes: int) -> None:
        """A batch of `sent_bytes` ran past its deadline: the next is at most a quarter of it."""
        self.batch_bytes = _clamp(sent_bytes // 4)
        if self.throughput is not None:
            self.throughput /= 4


@dataclass
class UploadProgress:
    """What an upload has stored so far; passed to the `progress` callback after each batch."""

    documents: int
    total_documents: int
    bytes: int
    total_bytes: int
    seconds: float

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-3)

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the rate so far; None before anything is stored."""
        if self.bytes == 0:
            return None
        return (self.total_bytes - self.bytes) / (self.bytes / max(self.seconds, 1e-3))

    def line(self) -> str:
        eta = "unknown" if self.eta_seconds is None else f"{self.eta_seconds:.1f} s"
        return (
            f"documents {self.documents}/{self.total_documents}, "
            f"{self.bytes / 1e6:.2f}/{self.total_bytes / 1e6:.2f} MB, "
            f"{self.megabytes_per_second:.2f} MB/s, ETA {eta}"
        )


def _clamp(value: int) -> int:
    return max(MIN_BATCH_BYTES, min(MAX_BATCH_BYTES, value))
