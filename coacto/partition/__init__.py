"""The tile model: how a network is cut into tiles, how the tiles are numbered, what each one
reads, and the questions schedulers ask of them.

* ``rules``     the partitioner: the blocks each layer is cut into, the exact dependencies of
                every operator family, and PARTITIONER_VERSION, which versions those rules.
* ``sequence``  the dependencies of MATMUL and EMBED layers, which read by storage position.
* ``plan``      TilePlan (the numbering, the dependencies, the work behind each tile) and the
                queries over a tile graph's plan: a layer's tiles, the inputs' tiles, ancestors,
                the cuts a network allows and what they send.

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

__all__ = [
    "OFFLOAD_MIN_COLUMN_BLOCKS", "PARTITIONER_VERSION", "TilePlan", "choose_splits",
    "cut_byte_array", "cut_bytes", "cut_flops", "cut_layers", "cut_needs", "cut_tiles",
    "flops_per_layer", "input_bytes", "input_tiles", "last_reader", "layer_bytes", "layer_flops",
    "layer_tiles", "number_tiles", "output_bytes", "partition", "single_tensor_cuts",
    "tile_output_flops", "valid_cuts", "wire_bytes",
]
