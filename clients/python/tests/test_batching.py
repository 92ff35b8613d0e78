"""Batch cutting, sizing and progress of `Lathe.upload_documents` (no server needed)."""

from __future__ import annotations

import pytest

from lathe_client.batching import (
    MAX_BATCH_BYTES,
    MIN_BATCH_BYTES,
    BatchSizer,
    UploadProgress,
    batch_end,
)


def test_batches_fill_up_to_their_bytes_and_always_take_one_document() -> None:
    sizes = [10, 20, 30, 500, 5]
    assert batch_end(sizes, 0, 60, 64) == 3
    assert batch_end(sizes, 0, 29, 64) == 1
    assert batch_end(sizes, 3, 60, 64) == 4  # a document larger than the batch goes alone
    assert batch_end(sizes, 0, 1000, 2) == 2  # the document count caps it too
    covered, start = [], 0
    while start < len(sizes):
        end = batch_end(sizes, start, 40, 64)
        assert end > start
        covered.extend(range(start, end))
        start = end
    assert covered == [0, 1, 2, 3, 4]


def test_batch_sizes_follow_the_measured_throughput() -> None:
    sizer = BatchSizer(64 * 1024, 10.0)
    sizer.observe(64 * 1024, 1.0)
    assert sizer.batch_bytes == 256 * 1024  # 640 KiB wanted, growth capped at 4-fold
    sizer.observe(256 * 1024, 4.0)
    assert sizer.batch_bytes == 640 * 1024
    sizer.observe(640 * 1024, 100.0)
    slowed = sizer.batch_bytes
    assert slowed < 640 * 1024
    sizer.timed_out(slowed)
    assert sizer.batch_bytes == max(slowed // 4, MIN_BATCH_BYTES)
    sizer.timed_out(1)
    assert sizer.batch_bytes == MIN_BATCH_BYTES
    fast = BatchSizer(MAX_BATCH_BYTES, 10.0)
    fast.observe(MAX_BATCH_BYTES, 0.001)
    assert fast.batch_bytes == MAX_BATCH_BYTES
    with pytest.raises(ValueError):
        BatchSizer(1024, 0)


def test_progress_names_documents_megabytes_rate_and_what_is_left() -> None:
    progress = UploadProgress(documents=120, total_documents=500, bytes=1_200_000, total_bytes=5_000_000, seconds=3.0)
    assert progress.line() == "documents 120/500, 1.20/5.00 MB, 0.40 MB/s, ETA 9.5 s"
    nothing = UploadProgress(documents=0, total_documents=5, bytes=0, total_bytes=100, seconds=1.0)
    assert nothing.eta_seconds is None
    assert nothing.line().endswith("ETA unknown")
