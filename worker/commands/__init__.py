"""The sub-commands' registrations: each module adds its commands to the CLI parser."""
