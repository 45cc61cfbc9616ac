"""Array codec round trips: ours against the seed's competitors, in one run, alternating; prints medians and ratios.

Round trip = encode, join into one body (the wire), decode. Every contender makes one copy of the array's data
(the join, or the serializer's own output buffer), except np.save/np.load through BytesIO, measured as the seed
wrote it. Run: ``.venv/bin/python benchmarks/codecs.py`` (add ``--quick`` for fewer repeats).
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import statistics
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable

import _results
import numpy as np
import orjson
import pyarrow as pa

from inference_server import codecs

NPY, NPZ = "application/x-npy", "application/x-npz"
RoundTrip = Callable[[np.ndarray], np.ndarray]


def ours_npy(array: np.ndarray) -> np.ndarray:
    body = b"".join(codecs.encode(array, NPY))
    return codecs.loads(body, NPY)  # type: ignore[no-any-return]


def ours_npz(array: np.ndarray) -> np.ndarray:
    body = b"".join(codecs.encode({"x": array}, NPZ))
    return codecs.loads(body, NPZ)["x"]  # type: ignore[no-any-return]


def pickle5(array: np.ndarray) -> np.ndarray:
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(array, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    lengths = struct.pack(f"<{len(raws) + 2}Q", len(raws), len(head), *(raw.nbytes for raw in raws))
    body = memoryview(b"".join([lengths, head, *raws]))
    count, head_length = struct.unpack_from("<2Q", body)
    sizes = struct.unpack_from(f"<{count}Q", body, 16)
    position = 16 + 8 * count
    head_view = body[position : position + head_length]
    position += head_length
    out_of_band = []
    for size in sizes:
        out_of_band.append(body[position : position + size])
        position += size
    return pickle.loads(head_view, buffers=out_of_band)  # type: ignore[no-any-return]


def arrow_tensor(array: np.ndarray) -> np.ndarray:
    sink = pa.BufferOutputStream()
    pa.ipc.write_tensor(pa.Tensor.from_numpy(array), sink)
    body = sink.getvalue()  # the serializer's own buffer is the wire: one copy
    return pa.ipc.read_tensor(pa.BufferReader(body)).to_numpy()  # type: ignore[no-any-return]


def np_save_load(array: np.ndarray) -> np.ndarray:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return np.load(io.BytesIO(buffer.getvalue()))  # type: ignore[no-any-return]


def stdlib_json(array: np.ndarray) -> np.ndarray:
    return np.array(json.loads(json.dumps(array.tolist())))


def or_json(array: np.ndarray) -> np.ndarray:
    return np.array(orjson.loads(orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)))


CONTENDERS: dict[str, RoundTrip] = {
    "ours npy": ours_npy,
    "ours npz": ours_npz,
    "pickle-5 out-of-band": pickle5,
    "pyarrow tensor IPC": arrow_tensor,
    "np.save/np.load": np_save_load,
    "orjson": or_json,
    "json": stdlib_json,
}
SLOW = {"json", "orjson"}


def measure(array: np.ndarray, repeats: int, names: list[str]) -> dict[str, float]:
    """Median seconds per round trip; contenders alternate, and the order rotates every repeat so that none always
    runs right after the same neighbour (whose freed memory changes the next one's page faults)."""
    for name in names:
        assert np.array_equal(CONTENDERS[name](array), array), name
    samples: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            if name in SLOW and i >= max(5, repeats // 100):
                continue
            started = time.perf_counter()
            CONTENDERS[name](array)
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def report(title: str, medians: dict[str, float], run: _results.Run) -> None:
    case = title.split(" (JSON")[0]
    run.group(case, "us", "lower", {name: seconds * 1e6 for name, seconds in medians.items()}, ["ours npy", "ours npz"])
    for name in list(medians)[1:]:
        targeted = case.startswith("seed") and name in ("pickle-5 out-of-band", "pyarrow tensor IPC")
        run.compare(case, "ours npy", name, target="<= 0.9x" if targeted else None)
    print(f"\n{title}")
    print(f"  {'contender':<22} {'median':>12} {'ours npy / it':>14}")
    for name, seconds in medians.items():
        ratio = medians["ours npy"] / seconds
        print(f"  {name:<22} {seconds * 1e6:>10.1f} us {ratio:>13.2f}x")


def encode_peak(array: np.ndarray, media_type: str) -> tuple[int, int]:
    """Bytes encoded and tracemalloc's peak while encoding."""
    tracemalloc.start()
    try:
        parts = codecs.encode(array if media_type == NPY else {"x": array}, media_type)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return sum(memoryview(part).nbytes for part in parts), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    _results.add_argument(parser)
    args = parser.parse_args()
    run = _results.Run("codecs", "quick" if args.quick else None)
    scale = 10 if args.quick else 1
    versions = f"numpy {np.__version__}, pyarrow {pa.__version__}, orjson {orjson.__version__}"
    print(f"python {sys.version.split()[0]}, {versions}")
    rng = np.random.default_rng(0)
    seed = rng.random((10000, 3, 4))
    report("seed array (10000, 3, 4) float64, 960 KB", measure(seed, 2000 // scale, list(CONTENDERS)), run)
    report("tiny array (1, 10) float64", measure(rng.random((1, 10)), 20000 // scale, list(CONTENDERS)), run)
    big = rng.random(25_000_000, dtype=np.float32)
    fast = [name for name in CONTENDERS if name not in SLOW]
    report(
        "100 MB float32 (JSON contenders skipped: minutes per round trip)", measure(big, 30 // min(scale, 3), fast), run
    )
    peaks = {}
    for media_type in (NPY, NPZ):
        size, peak = encode_peak(big, media_type)
        peaks[f"encode {media_type}"] = peak / 1e3
        print(f"\nencode {media_type} of {size / 1e6:.0f} MB: tracemalloc peak {peak / 1e3:.1f} KB")
    run.group("tracemalloc peak encoding 100 MB", "KB", "lower", peaks, list(peaks), chart=False)
    setup = "round trip: encode, join into one body, decode; medians, contenders alternating in a rotating order"
    run.write(args.results, "Array codecs, round trip (codecs.py)", setup, versions)


if __name__ == "__main__":
    main()
