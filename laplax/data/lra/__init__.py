"""Long Range Arena data (Tay et al., ICLR 2021): :mod:`laplax.data.lra.listops`,
:mod:`laplax.data.lra.text` (Text, Retrieval) and :mod:`laplax.data.lra.image`
(Image, Pathfinder)."""
