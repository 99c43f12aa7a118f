//! The hub download path, against a hub on 127.0.0.1 (`haares_data::local_hub`).

mod faults;
mod hub_answers;
mod users_files;
mod world;
