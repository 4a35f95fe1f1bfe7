"""Matrix, through matrix-nio: the client and its device (client.py), the sync loop, rooms and
their tenants, media events, uploads and downloads."""
