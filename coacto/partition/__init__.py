"""The tile model (docs/ARCHITECTURE.md §2's table and §3): ``rules`` cuts every layer into tiles
and derives their exact dependencies (``sequence`` those of MATMUL and EMBED layers, which read
by storage position); ``plan`` numbers the tiles (TilePlan) and answers the schedulers' questions
about them: a layer's tiles, the inputs', ancestors, the cuts a network allows and what they send.

Everything a caller needs is importable from ``coacto.partition``.
"""
from .plan import (
    TilePlan, cut_byte_array, cut_bytes, cut_flops, cut_layers, cut_needs, cut_tiles,
    flops_per_layer, input_bytes, input_tiles, last_reader, layer_bytes, layer_tiles,
    number_tiles, output_bytes, single_tensor_cuts, valid_cuts, wire_bytes,
)
from .rules import (
    OFFLOAD_MIN_COLUMN_BLOCKS, PARTITIONER_VERSION, choose_splits, layer_flops, partition,
    tile_output_flops,
)
