"""lidar_kernels `nms` node. NMS over box records (PointCloud2: x y z length width height yaw score label). Outputs ~/boxes (kept box records) and ~/markers (visualization_msgs/MarkerArray).

ros2 launch lidar_kernels nms.launch.py params_file:=/path/orin.param.yaml boxes_in:=/sensor/topic
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution([FindPackageShare('lidar_kernels'), 'config', 'cpu.param.yaml']),
            description='Node parameters (config/orin|xavier|desktop_gpu|cpu.param.yaml or your own).'),
        DeclareLaunchArgument('boxes_in', default_value='/detections/boxes', description='Input box-record PointCloud2 topic.'),
        DeclareLaunchArgument('namespace', default_value='', description='Namespace of the node.'),
        DeclareLaunchArgument('node_name', default_value='nms', description='Name of the node.'),
        DeclareLaunchArgument('reliable', default_value='true', description='Input QoS reliable (true) or best effort.'),
        Node(
            package='lidar_kernels',
            executable='nms',
            name=LaunchConfiguration('node_name'),
            namespace=LaunchConfiguration('namespace'),
            output='screen',
            parameters=[LaunchConfiguration('params_file'), {'reliable': LaunchConfiguration('reliable')}],
            remappings=[('boxes_in', LaunchConfiguration('boxes_in'))],
        ),
    ])
