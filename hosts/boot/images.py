"""OS images served by the console: files under IMAGE_DIR, with HTTP Range (the agent resumes a dropped
download) and a SHA256SUMS-style list of the checksums the OSImages declare."""
import os
import re
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, Http404, HttpResponse, StreamingHttpResponse
from django.views.decorators.http import require_GET

from pools.models import OSImage

CHUNK = 1 << 20


def _path(filename: str, folder: str = "") -> Path:
    if "/" in filename or filename.startswith(".") or not filename:
        raise Http404("no such image")
    path = Path(settings.IMAGE_DIR) / folder / filename
    if not path.is_file():
        raise Http404("no such image")
    return path


@require_GET
def image(request, filename: str, folder: str = ""):
    """IMAGE_DIR/<filename>, or IMAGE_DIR/agent/<filename>: the agent ramdisk's kernel and initrd (AGENT_KERNEL_URL
    and AGENT_INITRD_URL by default), as `python -m lab.vmimage ramdisk --out IMAGE_DIR` lays them out."""
    path = _path(filename, folder)
    size = path.stat().st_size
    ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", ""))
    if not ranged:
        response = FileResponse(open(path, "rb"), content_type="application/octet-stream")
        response["Accept-Ranges"] = "bytes"
        return response
    start = int(ranged.group(1))
    end = min(int(ranged.group(2)) if ranged.group(2) else size - 1, size - 1)
    if start > end:
        response = HttpResponse(status=416)
        response["Content-Range"] = f"bytes */{size}"
        return response

    def body():
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                data = f.read(min(CHUNK, left))
                if not data:
                    return
                left -= len(data)
                yield data

    response = StreamingHttpResponse(body(), status=206, content_type="application/octet-stream")
    response["Content-Range"] = f"bytes {start}-{end}/{size}"
    response["Content-Length"] = str(end - start + 1)
    response["Accept-Ranges"] = "bytes"
    return response


@require_GET
def checksums(request, kind: str):
    """SHA256SUMS / SHA512SUMS / MD5SUMS for the images the console serves."""
    wanted = {"SHA256SUMS": "sha256", "SHA512SUMS": "sha512", "MD5SUMS": "md5"}[kind]
    lines = [f"{i.checksum}  {os.path.basename(i.url)}\n" for i in OSImage.objects.filter(checksum_type=wanted)
             if "/images/" in i.url]
    return HttpResponse("".join(lines), content_type="text/plain")
