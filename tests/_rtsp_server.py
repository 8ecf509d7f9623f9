"""A real RTSP server for tests: GStreamer's gst-rtsp-server (Debian's gir1.2-gst-rtsp-server-1.0),
run by the system python (which has PyGObject): ``/usr/bin/python3 _rtsp_server.py PORT``.

It serves ``rtsp://127.0.0.1:PORT/cam``: a live test pattern (320x240, 30 fps) encoded as
H.264 (x264, or openh264 when x264 is absent) or, with ``--mjpeg``, as JPEG. It prints
``READY`` once it listens and runs until it is killed.
"""

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main() -> None:
    port = sys.argv[1]
    Gst.init(None)
    raw = "videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=30/1"
    if "--mjpeg" in sys.argv:
        enc = "jpegenc quality=80 ! rtpjpegpay name=pay0 pt=26"
    elif Gst.ElementFactory.find("x264enc") is not None:
        enc = "x264enc tune=zerolatency speed-preset=ultrafast key-int-max=15 ! rtph264pay name=pay0 pt=96 config-interval=1"
    else:
        enc = "openh264enc ! h264parse ! rtph264pay name=pay0 pt=96 config-interval=1"
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(port)
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(f"( {raw} ! videoconvert ! {enc} )")
    factory.set_shared(True)
    server.get_mount_points().add_factory("/cam", factory)
    if server.attach(None) == 0:
        print("FAILED to listen", flush=True)
        sys.exit(1)
    print("READY", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
