"""Figure of notebook 14: the ring schedule, which K/V block each rank holds at each step, and
which of those blocks a causal mask lets it skip (contiguous layout) or halve (zigzag)."""

from __future__ import annotations

from ...distributed import ring_schedule, ring_tiles, shard_segments
from ...viz.ring import RANK_COLORS
from ._draw import GREY, box, diagram

__all__ = ["draw_ring_schedule", "FIGURES"]


def _share(rank: int, src: int, world: int, layout: str) -> float:
    """Share of the (rank's queries) x (src's keys) block a causal ring computes (L = 4W rows)."""
    L = 4 * world
    segs = [shard_segments(L, r, world, layout=layout) for r in range(world)]
    n = sum(b - a for a, b in segs[rank]) * sum(b - a for a, b in segs[src])
    done = sum((tile.rows.stop - tile.rows.start) * (tile.cols.stop - tile.cols.start)
               for tile in ring_tiles(segs[rank], segs[src], is_causal=True))
    return done / n


def draw_ring_schedule(world: int = 4):
    """Rows: ranks; columns: steps. Cell: the K/V block held and the share of its scores computed."""
    fig, ax = diagram((11, 5.4), (-1.3, 2 * world * 1.25 + 0.6), (-1.5, world + 1.4))
    schedule = ring_schedule(world)
    for panel, layout in enumerate(("contiguous", "zigzag")):
        x0 = panel * (world * 1.25 + 0.9)
        ax.text(x0 + (world - 1) * 1.25 / 2, world + 0.9, f"{layout} layout, causal", ha="center", fontsize=11)
        for step in range(world):
            ax.text(x0 + step * 1.25, world + 0.35, f"step {step}", ha="center", fontsize=9)
            for rank in range(world):
                src = schedule[step][rank]
                share = _share(rank, src, world, layout)
                y = world - 1 - rank
                color = GREY if share == 0 else RANK_COLORS[src]
                label = f"K/V {src}\n" + (f"{share:.0%}" if share else "skipped")
                box(ax, x0 + step * 1.25, y, label, color, w=1.05, h=0.72, fontsize=8)
        if panel == 0:
            for rank in range(world):
                ax.text(x0 - 0.75, world - 1 - rank, f"rank {rank}", ha="right", va="center", fontsize=9)
    ax.text(world * 1.25, -1.2, "At step s rank r holds the K/V block of rank (r − s) mod W and sends it on to "
            "rank r + 1 (%: share of that block's scores computed; "
            "a diagonal block is masked inside).\nContiguous: rank r skips the blocks of "
            "later ranks, so rank W − 1 works most. Zigzag: every rank does the same work.", ha="center", fontsize=9)
    return fig


FIGURES = {"distributed_ring_schedule.png": draw_ring_schedule}
