"""Command lines: node-agent (main), ctl, and what --dry-run prints (render)."""
