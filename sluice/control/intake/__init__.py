"""The manifest Lambda's side: claim an uploaded manifest, route it, start the prepare stage or submit."""
