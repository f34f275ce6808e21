"""The loaders read the real files and the demo, which must share the real layout."""

import json

import numpy as np
import pytest
import scipy.io

from conftest import REAL_HICO, REAL_HICO_DET_JSON
from verbmirage.data.hico import (
    LIST_ACTION_FIELDS,
    AnnotationFormatError,
    hoi_vocabulary,
    load_hico,
    load_hico_det,
)
from verbmirage.core.text import gerund, hoi_phrase, object_with_article, verb_phrase


def test_real_anno_counts(real_anno):
    assert real_anno.labels["train"].shape == (38116, 600)
    assert real_anno.labels["test"].shape == (9658, 600)
    test = real_anno.labels["test"]
    assert (test == 1).sum() == 20268
    assert (test == 0).sum() == 7872
    assert (test == -1).sum() == 61912
    no_interaction = (real_anno.hois.verb == "no_interaction").to_numpy()
    assert (test[:, ~no_interaction] == 1).sum() == 19145
    assert real_anno.hois.verb.nunique() == 117 and real_anno.hois.object.nunique() == 80
    assert real_anno.images["test"][0] == "HICO_test2015_00000001.jpg"


def test_packaged_vocabulary_matches_real_anno(real_anno):
    vocab = hoi_vocabulary()
    assert vocab.verb.tolist() == real_anno.hois.verb.tolist()
    assert vocab.object.tolist() == real_anno.hois.object.tolist()


def test_gerunds_match_real_anno_except_its_typos(real_anno):
    mismatches = {
        (verb, ing) for verb, ing in zip(real_anno.hois.verb, real_anno.hois.verb_ing) if gerund(verb) != ing
    }
    assert mismatches == {("control", "controling"), ("spin", "spining")}


def test_readable_names():
    assert verb_phrase("sit_on") == "sitting on"
    assert object_with_article("hair_drier") == "a hair drier"
    assert object_with_article("umbrella") == "an umbrella"
    assert object_with_article("skis") == "skis"
    assert hoi_phrase("ride", "horse") == "riding a horse"
    assert hoi_phrase("watch", "tv") == "watching a TV"


def test_demo_has_the_real_layout(demo_roots, real_anno):
    demo = scipy.io.loadmat(demo_roots[0] / "anno.mat")
    real = scipy.io.loadmat(REAL_HICO / "anno.mat")

    def public(m):
        return {k for k in m if not k.startswith("__")}

    assert public(demo) == public(real)
    assert demo["list_action"].shape == real["list_action"].shape == (600, 1)
    assert demo["list_action"].dtype.names == real["list_action"].dtype.names == LIST_ACTION_FIELDS
    assert demo["list_action"][0, 0]["synset"].dtype.names == real["list_action"][0, 0]["synset"].dtype.names
    for key in ("anno_train", "anno_test"):
        assert demo[key].dtype == real[key].dtype and demo[key].shape[0] == 600
    assert demo["list_test"].dtype == object and demo["list_test"].shape[1] == 1


def test_demo_plants_the_hard_cases(demo_anno):
    test = demo_anno.labels["test"]
    verbs = demo_anno.hois.verb.to_numpy()
    assert set(np.unique(test[~np.isnan(test)])) == {-1.0, 0.0, 1.0}
    assert (test[:, verbs == "no_interaction"] == 1).any(), "no no_interaction positives"
    objects = demo_anno.hois.object.to_numpy()
    few_verbs = {o for o in set(objects) if ((objects == o) & (verbs != "no_interaction")).sum() < 4}
    used = {objects[h] for h in np.flatnonzero((test == 1).any(axis=0))}
    assert used & few_verbs, "no object with fewer than four plausible verbs"
    per_object = [
        max(((row == 1) & (objects == o)).sum() for o in set(objects[row == 1])) for row in test if (row == 1).any()
    ]
    assert max(per_object) >= 2, "no image with several positives of one object"
    assert np.isnan(test).any(axis=1).all()


def test_demo_is_deterministic(tmp_path, demo_roots):
    from verbmirage.data.demo import DemoSizes, write_demo_hico

    write_demo_hico(tmp_path / "a", tmp_path / "b", DemoSizes())
    # every byte, the MATLAB header too (scipy writes the time of writing there): artifacts built from the demo
    # data are compared byte for byte across runs
    assert (tmp_path / "a" / "anno.mat").read_bytes() == (demo_roots[0] / "anno.mat").read_bytes()
    assert (tmp_path / "b" / "anno_bbox.mat").read_bytes() == (demo_roots[1] / "anno_bbox.mat").read_bytes()
    image = "images/test2015/HICO_test2015_00000007.jpg"
    assert (tmp_path / "a" / image).read_bytes() == (demo_roots[0] / image).read_bytes()


def test_hico_det_demo_boxes(demo_roots, demo_anno):
    pairs = load_hico_det(demo_roots[1])
    test = pairs[pairs.split == "test"]
    assert set(test.image) <= set(demo_anno.images["test"])
    visible = test[test.invis == 0]
    assert (visible.n_humans > 1).any(), "no image with several humans"
    for x1, y1, x2, y2 in visible.human_box:
        assert x1 < x2 and y1 < y2
    # every visible labelled instance is a positive HOI of that image in anno.mat
    index = {name: i for i, name in enumerate(demo_anno.images["test"])}
    labels = demo_anno.labels["test"]
    assert all(labels[index[img], hoi] == 1 for img, hoi in zip(test.image, test.hoi_id))


def test_hico_det_struct_field_order(tmp_path):
    """Boxes are stored x1, x2, y1, y2 (1-based); the loader returns (x1, y1, x2, y2)."""
    from verbmirage.data.demo import _box_struct, _struct_array

    hoi = _struct_array([{"id": 3.0, "bboxhuman": _box_struct([(10, 20, 30, 40)]),
                          "bboxobject": _box_struct([(1, 2, 3, 4)]), "connection": np.array([[1.0, 1.0]]),
                          "invis": 0.0}])
    entry = _struct_array([{"filename": "HICO_test2015_00000001.jpg",
                            "size": {"width": 64.0, "height": 48.0, "depth": 3.0}, "hoi": hoi}])
    scipy.io.savemat(tmp_path / "anno_bbox.mat", {"bbox_train": np.zeros((1, 0)), "bbox_test": entry})
    stored = scipy.io.loadmat(tmp_path / "anno_bbox.mat")["bbox_test"][0, 0]["hoi"][0, 0]["bboxhuman"]
    assert stored.dtype.names == ("x1", "x2", "y1", "y2")
    pairs = load_hico_det(tmp_path)
    assert pairs.hoi_id.tolist() == [2]
    assert pairs.human_box.iloc[0] == (10.0, 20.0, 30.0, 40.0)


def test_real_hico_det_json_matches_anno(real_anno):
    if not REAL_HICO_DET_JSON.is_file():
        pytest.skip("HICO-DET instances JSON not present")
    data = json.loads(REAL_HICO_DET_JSON.read_text())
    assert data["filenames"] == real_anno.images["test"]
    assert sum(len(a["hoi"]) for a in data["annotation"]) == 33405
    labels = real_anno.labels["test"]
    positives = sum(labels[i, h] == 1 for i, a in enumerate(data["annotation"]) for h in set(a["hoi"]))
    total = sum(len(set(a["hoi"])) for a in data["annotation"])
    assert positives / total > 0.99  # the boxes annotate positive HOIs of anno.mat


def test_bad_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="anno.mat"):
        load_hico(tmp_path)
    (tmp_path / "anno.mat").write_bytes(b"not a mat file")
    with pytest.raises(AnnotationFormatError, match=str(tmp_path / "anno.mat")):
        load_hico(tmp_path)
    scipy.io.savemat(tmp_path / "anno.mat", {"anno_test": np.zeros((600, 2))})
    with pytest.raises(AnnotationFormatError, match="list_action"):
        load_hico(tmp_path)


def test_bad_label_value_is_located(tmp_path, demo_roots):
    mat = scipy.io.loadmat(demo_roots[0] / "anno.mat")
    mat = {k: v for k, v in mat.items() if not k.startswith("__")}
    mat["anno_test"][5, 3] = 2.0
    scipy.io.savemat(tmp_path / "anno.mat", mat)
    with pytest.raises(AnnotationFormatError, match=r"anno_test\[5, 3\] = 2.0"):
        load_hico(tmp_path)


# ---- input checks a tampered anno.mat is refused, naming the file ----
def _demo_mat(demo_roots) -> dict:
    mat = scipy.io.loadmat(demo_roots[0] / "anno.mat")
    return {k: v for k, v in mat.items() if not k.startswith("__")}


def _save(tmp_path, mat) -> str:
    scipy.io.savemat(tmp_path / "anno.mat", mat)
    return str(tmp_path / "anno.mat")


@pytest.mark.parametrize("name", ["../victim.jpg", "/etc/passwd", "images/HICO_test2015_1.jpg", "a b.jpg", ".."])
def test_unsafe_image_name_is_refused(tmp_path, demo_roots, name):
    mat = _demo_mat(demo_roots)
    mat["list_test"][2, 0] = np.array([name])
    path = _save(tmp_path, mat)
    with pytest.raises(AnnotationFormatError) as caught:
        load_hico(tmp_path)
    message = str(caught.value)
    assert path in message and repr(name) in message and "list_test[2]" in message


def test_duplicate_image_names_are_refused(tmp_path, demo_roots):
    mat = _demo_mat(demo_roots)
    mat["list_test"][4, 0] = mat["list_test"][1, 0]
    path = _save(tmp_path, mat)
    with pytest.raises(AnnotationFormatError, match=rf"{path}: list_test\[4\]: duplicate image name .* \[1\]"):
        load_hico(tmp_path)


def test_list_action_with_599_classes_is_refused(tmp_path, demo_roots):
    mat = _demo_mat(demo_roots)
    mat["list_action"] = mat["list_action"][:599]
    for split in ("train", "test"):
        mat[f"anno_{split}"] = mat[f"anno_{split}"][:599]
    path = _save(tmp_path, mat)
    with pytest.raises(AnnotationFormatError, match=rf"{path}: list_action has 599 actions, expected HICO's 600"):
        load_hico(tmp_path)


def test_list_action_with_swapped_verb_and_object_is_refused(tmp_path, demo_roots):
    mat = _demo_mat(demo_roots)
    action = mat["list_action"][7, 0]
    action["vname"], action["nname"] = action["nname"], action["vname"]
    path = _save(tmp_path, mat)
    with pytest.raises(AnnotationFormatError, match=rf"{path}: list_action\[7\] is \(vname='airplane'"):
        load_hico(tmp_path)


def test_numeric_image_list_names_the_file(tmp_path, demo_roots):
    mat = _demo_mat(demo_roots)
    mat["list_test"] = np.arange(len(mat["list_test"]), dtype=float).reshape(-1, 1)
    path = _save(tmp_path, mat)
    with pytest.raises(AnnotationFormatError, match=rf"{path}: list_test\[0\]: expected a MATLAB string"):
        load_hico(tmp_path)


def test_string_labels_name_the_file(tmp_path, demo_roots):
    mat = _demo_mat(demo_roots)
    mat["anno_test"] = "not labels"
    path = _save(tmp_path, mat)
    with pytest.raises(AnnotationFormatError, match=rf"{path}: anno_test: labels must be numeric"):
        load_hico(tmp_path)


def test_hico_det_unsafe_file_name_is_refused(tmp_path):
    from verbmirage.data.demo import _box_struct, _struct_array

    hoi = _struct_array([{"id": 3.0, "bboxhuman": _box_struct([(10, 20, 30, 40)]),
                          "bboxobject": _box_struct([(1, 2, 3, 4)]), "connection": np.array([[1.0, 1.0]]),
                          "invis": 0.0}])
    entry = _struct_array([{"filename": "../../victim.jpg",
                            "size": {"width": 64.0, "height": 48.0, "depth": 3.0}, "hoi": hoi}])
    scipy.io.savemat(tmp_path / "anno_bbox.mat", {"bbox_train": np.zeros((1, 0)), "bbox_test": entry})
    expected = r"anno_bbox.mat: bbox_test\[0\].filename: unsafe name '\.\./\.\./victim"
    with pytest.raises(AnnotationFormatError, match=expected):
        load_hico_det(tmp_path)


def test_real_anno_still_loads_with_the_checks(real_anno):
    """The real file passes every check: 600 HICO classes in order, unique plain names."""
    assert len(real_anno.hois) == 600
    for split in ("train", "test"):
        names = real_anno.images[split]
        assert len(set(names)) == len(names) and all(n.startswith(f"HICO_{split}2015_") for n in names)
