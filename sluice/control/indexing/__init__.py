"""The index stage from the control plane's side: its jobs, its plan, its submission and its end."""
