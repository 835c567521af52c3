"""A copy of a GGUF model with only its first N transformer blocks, for device checks.

The device tool carries at most 64 MiB and its machine cannot download, so a real model does
not fit there: SmolLM2-135M's Q4_1 file is 98 MB, its first 4 of 30 blocks 41 MB. The copy
keeps every metadata key (``<arch>.block_count`` set to N), the tokenizer, the embedding, the
final norm and the output layer, and blocks ``0 .. N-1`` byte for byte in their own tensor
types, so it loads through the same GGUF paths (native repack, tokenizer, chat template) as
the full file. Its answers are not meaningful text; comparing them between devices is the
point (``scripts/gguf_device_check.py``).

Usage: ``python scripts/gguf_truncate.py SRC.gguf DST.gguf --blocks 4``
Exits 2 with one line for a file gguf cannot read or a block count out of range.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def truncate(src: Path, dst: Path, blocks: int) -> int:
    """Write ``dst``: ``src`` with only blocks ``[0, blocks)``. Returns the tensors written.

    Raises ``ValueError`` when ``blocks`` is not within ``1 .. <arch>.block_count``."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)

    def text(field, i: int) -> str:
        return bytes(field.parts[i]).decode("utf-8", errors="surrogateescape")

    arch_field = reader.fields["general.architecture"]
    arch = text(arch_field, arch_field.data[0])
    count_key = f"{arch}.block_count"
    total = int(reader.fields[count_key].parts[reader.fields[count_key].data[0]][0])
    if not 1 <= blocks <= total:
        raise ValueError(f"--blocks must be within 1..{total} for {src.name}, got {blocks}")
    writer = GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer adds the header fields and the architecture itself
        kind = field.types[0]
        if name == count_key:
            writer.add_uint32(name, blocks)
        elif kind == GGUFValueType.ARRAY:
            if field.types[1] == GGUFValueType.STRING:
                values = [text(field, i) for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, values)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, text(field, field.data[0]))
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)
    kept = [t for t in reader.tensors
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < blocks]
    for t in kept:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--blocks", type=int, default=4, help="transformer blocks kept (default 4)")
    args = ap.parse_args(argv)
    try:
        n = truncate(args.src, args.dst, args.blocks)
    except (OSError, ValueError, KeyError) as exc:
        print(f"gguf_truncate: error: {args.src}: {exc}", file=sys.stderr)
        return 2
    size = args.dst.stat().st_size
    print(f"wrote {args.dst} ({n} tensors, {size / 2**20:.1f} MiB, {args.blocks} blocks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
