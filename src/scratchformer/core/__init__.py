"""The paper: every equation of sections 3.1-3.5 in one place. Imports torch and core/ only."""
