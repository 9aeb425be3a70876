"""The distributed index build: train once, index fragments in N segment children, commit once."""
