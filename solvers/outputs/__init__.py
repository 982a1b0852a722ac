"""What the user gets: the CLI, printed tables, plan files, launch files, pictures and the HTML report."""
