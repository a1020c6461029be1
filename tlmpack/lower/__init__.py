"""Lowering: TVM builds scheduled tasks into machine code for each target."""
