"""Emit: render the plan, link the model library, and pack the reproducible artifact."""
