"""Overlap device->host copies and shard writes with compute (shared layer).

Each batch's packed states are copied to pinned host memory on a side CUDA stream, and a
writer thread puts each sample's rows into the shard file (``shards.ShardFileWriter``)
while the next batch computes. Used by both capture backends (``capture_hidden_states``'
hooks, ``vllm.capture``'s engine workers).
"""

from __future__ import annotations

import queue
import threading

import torch

from .shards import ShardFileWriter


class WriterPipeline:
    """Overlap device->host copies and shard writes with the next batch's compute.

    ``submit(samples, packed)`` takes the per-sample row counts of a batch and its packed
    states ``(hidden [N, A*H], last [N, H], hidden_scale, last_scale)`` on the compute
    device (N = sum of the samples' tokens). On CUDA the copy runs on a side stream into
    pinned memory; a thread waits for it and writes each sample's rows. ``depth`` batches
    may be in flight, which bounds host memory.
    """

    def __init__(self, writer: ShardFileWriter, tokens: list[tuple], device: str, depth: int = 3, threads: int = 4):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="shard-pwrite")  # pwrite drops the GIL
        self.writer = writer
        self.tokens = tokens  # per sample: (input_ids np.int32, loss_mask np.uint8)
        self.cuda = device.startswith("cuda")
        self.stream = torch.cuda.Stream() if self.cuda else None
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="shard-writer", daemon=True)
        self.thread.start()

    def submit(self, samples: list[int], packed: tuple) -> None:
        if self.error:
            raise self.error
        event = None
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                host = tuple(None if t is None else _to_pinned(t) for t in packed)
                event = torch.cuda.Event()
                event.record(self.stream)
            for t in packed:  # keep the device tensors alive until the side stream is done
                if t is not None:
                    t.record_stream(self.stream)
        else:
            host = packed
        self.q.put((samples, host, event))

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error:
                continue
            samples, (hidden, last, hs, ls), event = item
            try:
                if event is not None:
                    event.synchronize()
                row, jobs = 0, []
                for j in samples:
                    ids, mask = self.tokens[j]
                    sl = slice(row, row + len(ids))
                    jobs.append(self.pool.submit(
                        self.writer.write_sample, j, hidden[sl], last[sl], torch.from_numpy(ids), torch.from_numpy(mask),
                        None if hs is None else hs[sl], None if ls is None else ls[sl]))
                    row += len(ids)
                for f in jobs:
                    f.result()
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                self.error = e

    def finish(self) -> None:
        """Wait for every write; re-raise a writer error."""
        self.q.put(None)
        self.thread.join()
        self.pool.shutdown()
        if self.error:
            raise self.error


def _to_pinned(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out
