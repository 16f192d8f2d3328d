"""Training data for the draft head: speculators' dataset, packing and collation over our shards.

A private module of the train subpackage (it imports no stage module). speculators supplies the pieces
(speculators/train/data.py: ``BaseDataset``, ``CollateFn``;
speculators/train/distributed_batch_sampler.py: ``MultipackDistributedBatchSamplerV2``;
speculators/models/eagle3/data.py: ``shift_batch``, the EAGLE-3 input/target shift,
arXiv:2503.01840 §3); this module reads our shards into them and loads batches ahead of
the accelerator on a background thread.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from ..formats.shards import ShardReader, unpack_fp8


def shard_dataset_class():
    """speculators' ``BaseDataset`` subclass over our shards (built on first call: speculators is
    imported lazily). Construct it as ``cls(paths, max_len, hidden_states_dtype, noise_std=..., seed=...,
    packed=False)``.

    A sample (``BaseDataset.__getitem__``) holds ``hidden_states`` ``[seq, num_aux * hidden]``
    and ``verifier_last_hidden_states`` ``[seq, hidden]`` in ``hidden_states_dtype``,
    ``input_ids`` ``[seq]`` int64 and ``loss_mask`` ``[seq]``, truncated to ``max_len``; with ``packed`` (kept only
    where every shard is fp8 and ``noise_std`` is 0: the dataset's ``packed``) both states stay as stored, uint8 rows
    of fp8 values and scales (``ShardReader.packed``), for the trainer to dequantise on its device
    (``Batches.to_device``).
    """
    from speculators.train.data import BaseDataset

    class ShardDataset(BaseDataset):
        """speculators ``BaseDataset`` over our shards.

        ``noise_std`` adds N(0, σ²) to the aux states, drawn from a generator seeded by
        (seed, epoch, sample): the same noise whatever the order of reads, so a resumed run
        sees exactly the noise an uninterrupted one would.
        """

        def __init__(self, paths: list[str], max_len: int, hidden_states_dtype: torch.dtype, *, noise_std: float,
                     seed: int, packed: bool = False):
            self.readers = [ShardReader(p) for p in paths]
            # packed only where every shard is fp8 and no noise is added to the states
            self.packed = packed and noise_std == 0 and bool(self.readers) and all(r.meta.fp8 for r in self.readers)
            self.index = [(r, i) for r in self.readers for i in range(len(r))]
            self.noise_std = noise_std
            self.seed = seed
            self.epoch = 0
            super().__init__(max_len=max_len, hidden_states_dtype=hidden_states_dtype)

        def __len__(self) -> int:
            return len(self.index)

        def _compute_approx_lengths(self) -> list[int]:
            return [r.length(i) for r, i in self.index]

        def _get_raw_data(self, index: int):
            r, i = self.index[index]
            if self.packed:
                return r.packed(i)
            return cast_and_noise(r[i], self.hidden_states_dtype, self.noise_std, self.seed, self.epoch, index)

    return ShardDataset


def cast_and_noise(d: dict, dtype: torch.dtype, noise_std: float, seed: int, epoch: int, index: int) -> dict:
    """A sample's ``hidden_states`` and ``verifier_last_hidden_states`` cast to ``dtype`` and N(0, ``noise_std``²)
    added to the aux states, drawn from a generator seeded by (``seed``, ``epoch``, sample ``index``): the
    same noise whatever the order of reads, for shards and online states alike. Changes ``d`` in place."""
    d["hidden_states"] = d["hidden_states"].to(dtype)
    d["verifier_last_hidden_states"] = d["verifier_last_hidden_states"].to(dtype)
    if noise_std > 0:
        g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_003 + index)
        noise = torch.randn(d["hidden_states"].shape, generator=g, dtype=torch.float32)
        d["hidden_states"] = d["hidden_states"] + (noise_std * noise).to(d["hidden_states"].dtype)
    return d


@dataclass
class PrefetchWaits:
    """Seconds each side of ``Batches.prefetch``'s queue spent, summed over the steps it delivered:
    ``load_s`` loading (shard reads or the online target's forwards, and collation), ``loader_wait_s``
    the loader blocked on a full queue (the trainer is the slower side), ``trainer_wait_s`` the trainer
    blocked on an empty one (the loader is the slower side)."""

    load_s: float = 0.0
    loader_wait_s: float = 0.0
    trainer_wait_s: float = 0.0
    steps: int = 0

    def summary(self, seconds: float) -> dict:
        """The waits and their shares of ``seconds`` (the run's wall time), rounded: what the training log
        and ``metrics.json`` report."""
        out = {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}
        for k in ("load_s", "loader_wait_s", "trainer_wait_s"):
            out[k.replace("_s", "_share")] = round(getattr(self, k) / max(seconds, 1e-9), 4)
        return out


@dataclass(frozen=True)
class BatchLayout:
    """How a run's batches are packed and for whom: ``total_seq_len`` tokens per packed row, ``hidden_size`` and
    ``num_aux`` (the states' shapes), ``dtype`` of the states, ``seed`` (sampling and noise), ``noise_std`` (the
    aux states' N(0, σ²) noise, their units), ``world_size`` ranks of which this process computes ``ranks``
    (None: all), ``shift``: rows ``shift_batch``ed (EAGLE-3, P-EAGLE) or as collated (DFlash, which pairs
    each position with the target's logits at the one before itself). ``dequantize_on_device``: fp8 shards read
    without noise are dequantised by ``Batches.to_device`` on the trainer's device instead of on the loader's thread
    (the same values bit for bit, half the bytes to copy; the host's fp8 conversion is most of the loader's work, which
    shares the interpreter with the trainer's dispatch: record ``train-loader_cpu``). ``Batches`` are built for one."""

    total_seq_len: int
    hidden_size: int
    num_aux: int
    dtype: torch.dtype
    seed: int
    noise_std: float
    world_size: int = 1
    ranks: list[int] | None = None
    shift: bool = True
    dequantize_on_device: bool = False


class Batches:
    """Packed batches over shards for the ranks this process computes.

    One global step consists of one packed ``[1, total_seq_len]`` row per rank (speculators'
    ``MultipackDistributedBatchSamplerV2`` over ``world_size`` replicas). Under DDP a
    process computes its own rank's row; a single process may compute every rank's row
    itself (``ranks = range(world_size)``) and so reproduce a multi-GPU run's global batch.

    A collated row (``CollateFn``, shifted by ``shift_batch``) holds ``hidden_states``
    ``[1, total_seq_len, num_aux * hidden_size]`` and ``verifier_last_hidden_states``
    ``[1, total_seq_len, hidden_size]`` in ``dtype``; ``input_ids``, ``position_ids`` and
    ``document_ids`` (-1 on padding) ``[1, total_seq_len]`` int64; ``loss_mask``
    ``[1, total_seq_len]``. Sampling is seeded by ``seed`` and the epoch; the aux-state noise
    (``noise_std``, in the states' own units) by ``seed``, the epoch and the sample.

    ``packed`` (``dequantize_on_device`` asked for, every shard fp8, no noise, no other dataset): the rows' two states
    are uint8 ``[1, total_seq_len, G*H + 4*G]`` (``shards.pack_fp8``), which ``to_device`` turns into the layout
    above on the device; ``to_device`` is the way rows reach the model either way.
    """

    def __init__(self, paths: list[str], layout: BatchLayout, dataset=None):
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import CollateFn
        from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

        # ``dataset``: another BaseDataset in place of the shards' (online training: train.online_data)
        lay, seq = layout, layout.total_seq_len
        self.dataset = dataset if dataset is not None else shard_dataset_class()(
            paths, seq, lay.dtype, noise_std=lay.noise_std, seed=lay.seed, packed=lay.dequantize_on_device)
        self.packed = getattr(self.dataset, "packed", False)
        self.dtype, self.num_aux = lay.dtype, lay.num_aux
        self.waits = PrefetchWaits()
        self.depth = 2  # steps loaded ahead (prefetch)
        self.ranks = list(lay.ranks if lay.ranks is not None else range(lay.world_size))
        self.samplers = [
            MultipackDistributedBatchSamplerV2(batch_max_length=seq, lengths=self.dataset.approx_lengths,
                                               num_replicas=lay.world_size, rank=r, seed=lay.seed)
            for r in self.ranks
        ]
        # packed rows: CollateFn copies the states' bytes into uint8 buffers (its buffer dtype for the states' keys)
        self.collate = CollateFn(seq, lay.hidden_size, num_target_layers=lay.num_aux,
                                 dtype=torch.uint8 if self.packed else lay.dtype,
                                 preprocess=shift_batch if lay.shift else None)

    def steps_per_epoch(self) -> int:
        """Global steps in one epoch (packed rows per rank; the same for every rank)."""
        return len(self.samplers[0])

    def epoch(self, epoch: int) -> list[list]:
        """``[step][rank-slot]`` -> sample indices, for ``epoch`` (deterministic in seed and epoch)."""
        for s in self.samplers:
            s.set_epoch(epoch)
        self.dataset.epoch = epoch
        per_rank = [list(s) for s in self.samplers]
        return [list(step) for step in zip(*per_rank, strict=True)]

    def load(self, indices) -> dict:
        """One collated row (see the class docstring) from the dataset samples ``indices``."""
        return self.collate([self.dataset[int(i)] for i in indices])

    def to_device(self, row: dict, device: str) -> dict[str, torch.Tensor]:
        """A collated row's model inputs (``MODEL_KEYS``) on ``device`` (``to_device``); packed rows' states
        dequantised there into ``[1, total_seq_len, G*H]`` in the batches' ``dtype`` (``shards.unpack_fp8``)."""
        out = to_device(row, device)
        if self.packed:
            out["hidden_states"] = unpack_fp8(out["hidden_states"], self.num_aux, self.dtype)
            out["verifier_last_hidden_states"] = unpack_fp8(out["verifier_last_hidden_states"], 1, self.dtype)
        return out

    def prefetch(self, steps: list[list], pin: bool = False, depth: int | None = None):
        """Yield each step's collated rows, loaded by a background thread ``depth`` steps ahead
        (``depth``: ``self.depth`` unless given; shard reads, or the online target's forwards, and
        collation overlap the accelerator's work: a bounded queue). Where each side waited is added
        to ``self.waits`` (``PrefetchWaits``)."""
        import queue
        import threading

        q: queue.Queue = queue.Queue(maxsize=depth or self.depth)
        stop = threading.Event()
        waits = self.waits

        def work():
            try:
                for step in steps:
                    t0 = time.perf_counter()
                    rows = [self.load(ix) for ix in step]
                    if pin:
                        rows = [{k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows]
                    t1 = time.perf_counter()
                    waits.load_s += t1 - t0
                    while not stop.is_set():
                        try:
                            q.put(rows, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    waits.loader_wait_s += time.perf_counter() - t1
                    if stop.is_set():
                        return
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                q.put(e)
            q.put(None)

        t = threading.Thread(target=work, daemon=True, name="batch-prefetch")
        t.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = q.get()
                waits.trainer_wait_s += time.perf_counter() - t0
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                waits.steps += 1
                yield item
        finally:
            stop.set()


MODEL_KEYS = ("hidden_states", "input_ids", "document_ids", "loss_mask", "position_ids", "verifier_last_hidden_states")


def to_device(row: dict, device: str) -> dict[str, torch.Tensor]:
    """The tensors of a collated row that speculators' ``Eagle3DraftModel.forward`` takes
    (``MODEL_KEYS``), on ``device`` (non-blocking: the row is pinned on CUDA)."""
    return {k: row[k].to(device, non_blocking=True) for k in MODEL_KEYS}
