"""The console serves OS images with Range support, and their checksums."""
import hashlib

import pytest

from pools.models import OSImage

pytestmark = pytest.mark.django_db


@pytest.fixture
def image_dir(tmp_path, settings):
    settings.IMAGE_DIR = tmp_path
    data = bytes(range(256)) * 4096  # 1 MiB
    (tmp_path / "tiny.raw").write_bytes(data)
    OSImage.objects.create(name="tiny", url="http://127.0.0.1:8000/images/tiny.raw",
                           checksum=hashlib.sha256(data).hexdigest(), checksum_type="sha256")
    return data


def test_an_image_is_served_whole_and_by_range(client, image_dir):
    whole = client.get("/images/tiny.raw")
    assert whole.status_code == 200 and b"".join(whole.streaming_content) == image_dir
    part = client.get("/images/tiny.raw", HTTP_RANGE="bytes=1000-")
    assert part.status_code == 206 and part["Content-Range"] == f"bytes 1000-{len(image_dir) - 1}/{len(image_dir)}"
    assert b"".join(part.streaming_content) == image_dir[1000:]
    assert client.get("/images/tiny.raw", HTTP_RANGE=f"bytes={len(image_dir) + 5}-").status_code == 416


def test_checksums_list_the_images_the_console_serves(client, image_dir):
    text = client.get("/images/SHA256SUMS").content.decode()
    assert text == f"{hashlib.sha256(image_dir).hexdigest()}  tiny.raw\n"


@pytest.mark.parametrize("name", ["missing.raw", "..", ".hidden"])
def test_no_path_outside_the_image_directory(client, image_dir, name):
    assert client.get(f"/images/{name}").status_code == 404


def test_the_agent_ramdisk_is_served_from_its_folder_where_the_default_kernel_and_initrd_urls_point(
        client, image_dir, tmp_path, settings):
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "vmlinuz").write_bytes(b"kernel")
    assert settings.AGENT_KERNEL_URL.endswith("/images/agent/vmlinuz")
    response = client.get("/images/agent/vmlinuz")
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"kernel"
    assert client.get("/images/agent/initrd").status_code == 404
    assert client.get("/images/agent/..").status_code == 404
