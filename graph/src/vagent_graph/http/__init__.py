"""The HTTP doors of the graph: the bot's API (api.py), the admin API (admin.py), the app
and its lifespan (app.py), and the middleware every request passes (middleware.py)."""
