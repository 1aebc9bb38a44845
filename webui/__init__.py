from webui.router import create_ui_router

__all__ = ["create_ui_router"]
