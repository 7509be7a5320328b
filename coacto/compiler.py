"""ONNX model -> tile graph: coacto.compile, coacto.partition_graph and coacto.load.

A module of their own, not the package root, so that the commands, the tuner, the server and the
simulator import them from where they are defined: the root re-exports them together with Client
and Server, and a submodule that imported the root would depend on everything the root exports.
"""
from __future__ import annotations

from .tilegraph import TileGraph


def compile(model, tiles_per_layer: int | None = None, input_shapes: dict | None = None,
            layer_tiles: dict | None = None, min_column_blocks: int = 0,
            threads: int | None = None) -> TileGraph:
    """Import an ONNX model (path, bytes or ModelProto) and cut it into a tile graph.

    ``tiles_per_layer``: tiles per layer (None: a FLOP-based heuristic, see coacto.partition);
    ``input_shapes``: {input name: shape} for inputs with dynamic dimensions;
    ``layer_tiles``: {layer index: tiles} for single layers, e.g. a profile `coacto tune` wrote
    (see coacto.tune.tuned_layer_tiles). It becomes part of the graph's parameters (and id).
    ``min_column_blocks``: fewest column blocks of image layers, for graphs meant for offloading
    (coacto.partition.OFFLOAD_MIN_COLUMN_BLOCKS; clients use it); also part of the parameters.
    ``threads``: the computing threads a local Runtime will run the graph on, when known (with
    one, a cheap layer is one tile, not four; with more than four, that many, up to 16); also
    part of the parameters. Graphs for offloading leave it out (the server computes with its
    own). With ``threads`` a 1x1 convolution that only feeds a depthwise one also becomes its
    prologue (coacto.frontend.fuse.fuse_pointwise_prologues): fewer layers than the ONNX file's
    Conv nodes, a graph only a local Runtime runs (a Client refuses it).
    """
    graph = import_graph(model, input_shapes, local=threads is not None)
    return partition_graph(graph, tiles_per_layer, input_shapes, layer_tiles, min_column_blocks,
                           threads)


def import_graph(model, input_shapes: dict | None = None, local: bool = False):
    """The operator graph compile partitions: imported, and for a ``local`` Runtime with the
    pointwise prologues fused (`coacto tune` imports the same graph compile would)."""
    from .frontend import import_model  # the onnx package loads here, not on `import coacto`
    from .frontend.fuse import fuse_pointwise_prologues

    graph = import_model(model, input_shapes=input_shapes)
    return fuse_pointwise_prologues(graph) if local else graph


def partition_graph(graph, tiles_per_layer: int | None = None, input_shapes: dict | None = None,
                    layer_tiles: dict | None = None, min_column_blocks: int = 0,
                    threads: int | None = None) -> TileGraph:
    """The second half of compile: an imported operator graph (coacto.ir.Graph) -> tile graph.
    Tuning partitions one imported graph many times."""
    from .partition import partition

    plan = partition(graph, tiles_per_layer, layer_tiles, min_column_blocks, threads)
    params = _params(tiles_per_layer, input_shapes, layer_tiles, min_column_blocks, threads,
                     has_prologues(graph))
    return TileGraph.build(graph, plan, params)


def has_prologues(graph) -> bool:
    """Whether an operator graph has layers with a pointwise prologue (a local graph)."""
    return any(layer.op == "CONV" and layer.attrs.get("pre") for layer in graph.layers)


def check_offloadable(tg: TileGraph, error: type[Exception]) -> TileGraph:
    """``tg`` when a server could hold its layers; raises ``error`` for a graph compiled for a
    local Runtime, whose 1x1 expansions are prologues of the depthwise layers after them."""
    if tg.params.get("prologues"):
        raise error("this tile graph was compiled for a local Runtime (coacto.compile with "
                    "threads=..., or `coacto compile`): some 1x1 convolutions became prologues "
                    "of the depthwise layers after them, which the server's graph does not "
                    "have; give the .onnx file (or a graph compiled without threads) instead")
    return tg


def repartition(tg: TileGraph, tiles_per_layer: int | None = None,
                layer_tiles: dict | None = None, min_column_blocks: int = 0,
                threads: int | None = None) -> TileGraph:
    """``tg``'s model cut into other tiles, as partition_graph would cut it with these
    parameters (its input shapes kept), on ``tg``'s weights: neither copied nor, in the native
    runtime, packed twice (TileGraph.retiled). A device's client runs its local inferences on
    one graph and offloads with another."""
    from .partition import partition

    plan = partition(tg.graph, tiles_per_layer, layer_tiles, min_column_blocks, threads)
    shapes = tg.params.get("input_shapes") or {}
    return tg.retiled(plan, _params(tiles_per_layer, shapes, layer_tiles, min_column_blocks,
                                    threads, has_prologues(tg.graph)))


def _params(tiles_per_layer, input_shapes, layer_tiles, min_column_blocks, threads,
            prologues: bool = False) -> dict:
    params = {
        "tiles_per_layer": tiles_per_layer,
        # plain ints: the parameters are JSON (and part of the graph id), numpy ints are not
        "input_shapes": {k: [int(d) for d in v] for k, v in sorted((input_shapes or {}).items())},
    }
    if min_column_blocks:  # absent otherwise, like layer_tiles
        params["min_column_blocks"] = int(min_column_blocks)
    if threads is not None:  # absent otherwise, so graphs compiled without it keep their ids
        params["threads"] = int(threads)
    if prologues:  # the layers differ from the server's: the id must too
        params["prologues"] = 1
    if layer_tiles:  # absent otherwise, so untuned graphs keep their ids
        params["layer_tiles"] = {str(int(k)): int(v) for k, v in sorted(layer_tiles.items(),
                                                                        key=lambda kv: int(kv[0]))}
    return params


def load(path) -> TileGraph:
    """Read a tile graph file written by TileGraph.save / `coacto compile`."""
    return TileGraph.load(path)
