"""The local AWS emulator: a moto server, the template's resources on it, its buses, its Batch executor and sweep."""
