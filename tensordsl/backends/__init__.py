"""The back ends: one `Backend` record per back end (`BACKENDS`), and their runners."""
