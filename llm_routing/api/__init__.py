"""DRF face of the router: serializers, views, urls."""
