"""The paper: sections 3.1-3.5 (with the config and input checks). Imports core/ and torch only."""
