"""Long Range Arena data (Tay et al., ICLR 2021): :mod:`laplax.data.lra.listops`."""
